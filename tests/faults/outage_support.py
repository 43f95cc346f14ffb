"""The whole system as separate processes, for the outage tests: a private PostgreSQL cluster (initdb on a free
port, stopped and started again on it), a private Redis, ``manage.py runsystem --no-agents`` on them (web, worker,
beat; killed all at once and started again on the same port), and node agents as processes of their own
(``tests.faults.agent_process``: simulated GPUs, the real Docker runtime) whose every road to and from the
control plane runs through two TCP proxies (tests/faults/partition_support.py), so that each agent can be cut
off, SIGKILLed or SIGSTOPped alone.

What really ran is read from Docker itself: container start/die/kill/stop events (``docker events --since
--until``) and State.StartedAt/FinishedAt. The control plane's record is read with plain SQL from the private
cluster (this process's Django is the suite's, on another database).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import requests

from nodeagent.runtime.containers import LABEL_LAUNCH, LABEL_NODE, parse_docker_time
from nodeagent.runtime.localimage import DEFAULT_TAG
from tests.conftest import service_missing
from tests.faults.partition_support import TcpProxy, free_port
from tests.faults.redis_support import FaultRedis
from tests.runsystem_support import ROOT, RunningSystem

LABEL_RESERVATION = "gpucp.reservation"
# What a fault may not do to a container: Docker's events for a process that ended.
STOP_EVENTS = ("die", "kill", "stop")
GPUS_PER_NODE = 2
# Ends at once on SIGTERM (a stop at the window's end takes no grace), runs until then.
JOB = ["sh", "-c", 'echo started; trap "exit 0" TERM; while true; do sleep 0.2; done']


def _pg_bin(name: str) -> str | None:
    if found := shutil.which(name):
        return found
    for directory in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (directory / name).exists():
            return str(directory / name)
    return None


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own on a free 127.0.0.1 port: ``stop()`` is the outage (every
    connection dropped, new ones refused), ``start()`` the same database back on the same port."""

    def __init__(self) -> None:
        initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if initdb is None or self.pg_ctl is None:
            service_missing("PostgreSQL's initdb and pg_ctl (for a private cluster to stop and start)")
        assert initdb is not None
        # A directory of its own under the temp root, not pytest's: pytest's are private to this user, and as
        # root the cluster runs as ``postgres``, who could not reach them.
        workdir = self.workdir = Path(tempfile.mkdtemp(prefix="faults-pg-"))
        self.data = workdir / "pgdata"
        self.port = free_port()
        self.data.mkdir(mode=0o700, parents=True)
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            shutil.chown(workdir, "postgres")
            shutil.chown(self.data, "postgres")
        self._run([initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self.start()

    def _run(self, argv: list[str]) -> None:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def _ctl(self, *args: str) -> None:
        assert self.pg_ctl is not None
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run([self.pg_ctl, "-D", str(self.data), "-o", options, "-w", "-l", str(self.workdir / "pg.log"), *args])

    def start(self) -> None:
        self._ctl("start")

    def stop(self, *, mode: str = "fast") -> None:
        self._ctl("stop", "-m", mode)

    def close(self) -> None:
        try:
            self.stop(mode="immediate")
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.workdir, ignore_errors=True)


def agent_env() -> dict[str, str]:
    """An agent's environment: nothing of the control plane's (its database, its var dir: a ``kill_all`` of the
    control plane finds its processes by that var dir and must leave the agents alone)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "CONTROLPLANE_VAR_DIR"} and not k.startswith("NODEAGENT_")
    }
    env.update(PYTHONUNBUFFERED="1", FAULTS_AGENT_BACKOFF_CAP_S="2")
    return env


class AgentProcess:
    """``python -m tests.faults.agent_process run`` for one simulated node (2 H100s, the Docker runtime), its
    heartbeats through one proxy, the control plane's pushes through another."""

    def __init__(self, *, hostname: str, workdir: Path, control_plane_port: int) -> None:
        self.hostname = hostname
        self.state_dir = workdir / hostname
        self.log_path = workdir / f"{hostname}.log"
        self.listen_port = free_port()
        self.to_control_plane = TcpProxy(("127.0.0.1", control_plane_port)).start()
        self.to_agent = TcpProxy(("127.0.0.1", self.listen_port)).start()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, join_token: str | None = None) -> None:
        env = {**agent_env(), "FAULTS_AGENT_FRONT_PORT": str(self.to_agent.port)}
        if join_token:
            env["NODEAGENT_JOIN_TOKEN"] = join_token
        argv = [
            sys.executable, "-m", "tests.faults.agent_process", "run",
            "--server", self.to_control_plane.url, "--hostname", self.hostname,
            "--simulate", f"{GPUS_PER_NODE}xH100-80GB", "--state-dir", str(self.state_dir),
            "--runtime", "docker", "--listen", f"127.0.0.1:{self.listen_port}", "--no-ssh", "--interval", "1",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def partition(self) -> None:
        self.to_control_plane.stop()
        self.to_agent.stop()

    def heal(self) -> None:
        self.to_control_plane.start()
        self.to_agent.start()

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=10)

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.thaw()
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.to_control_plane.stop()
        self.to_agent.stop()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


SETUP = """
from decimal import Decimal
from django.contrib.auth import get_user_model
from controlplane.accounts.choices import Role
from controlplane.accounts.models import Membership, Project
from controlplane.accounts.services import api_token_create
from controlplane.fleet.services import join_token_create
from controlplane.ledger import services as ledger
user, _ = get_user_model().objects.get_or_create(username="faults")
for slug, requeue in (("faults", False), ("faults-requeue", True)):
    project, _ = Project.objects.get_or_create(slug=slug, defaults={"name": slug, "requeue_on_interrupt": requeue})
    Membership.objects.get_or_create(project=project, user=user, defaults={"role": Role.OWNER})
    ledger.quota_policy_set(project=project, actor=None, credits_per_period=Decimal("100000"),
                            max_concurrent_gpus=64, max_reservation_hours=Decimal("2"))
    ledger.ledger_grant_period(project=project)
print("api", api_token_create(user=user, name="faults")[1])
for _ in range(%d):
    print("join", join_token_create(actor=None, note="faults")[1])
"""


@dataclass
class Ran:
    """One container as Docker recorded it."""

    name: str
    reservation: str
    launch: str
    node: str
    status: str
    started: datetime
    finished: datetime | None  # None while it runs


class DockerRecord:
    """Every start and death of this fleet's containers, from the engine's event stream as it happens: the record
    outlives the containers (an agent removes one once it has reported its exit)."""

    def __init__(self, docker_client: Any, hosts: Callable[[], set[str]]) -> None:
        self.hosts = hosts
        self.ran: dict[str, Ran] = {}
        self._lock = threading.Lock()
        self._events = docker_client.events(decode=True, filters={"type": "container", "event": ["start", "die"]})
        threading.Thread(target=self._read, daemon=True, name="docker-events").start()

    def _read(self) -> None:
        try:
            for event in self._events:
                labels = event.get("Actor", {}).get("Attributes", {})
                if labels.get(LABEL_NODE) not in self.hosts():
                    continue
                at = datetime.fromtimestamp(event["timeNano"] / 1e9, UTC)
                with self._lock:
                    if event["Action"] == "start":
                        self.ran[event["id"]] = Ran(
                            name=labels.get("name", ""),
                            reservation=labels.get(LABEL_RESERVATION, ""),
                            launch=labels.get(LABEL_LAUNCH, ""),
                            node=labels[LABEL_NODE],
                            status="running",
                            started=at,
                            finished=None,
                        )
                    elif (known := self.ran.get(event["id"])) is not None:
                        known.status, known.finished = "exited", at
        except Exception:  # the stream is closed at the end
            return

    def of(self, reservation: str) -> list[Ran]:
        with self._lock:
            return sorted((r for r in self.ran.values() if r.reservation == reservation), key=lambda r: r.started)

    def close(self) -> None:
        self._events.close()


class System:
    """The control plane (runsystem, no agents of its own) on a private PostgreSQL and Redis, and agent
    processes. ``settings`` go into the control plane's environment."""

    def __init__(self, workdir: Path, *, settings: dict[str, str], agents: int, docker_client: Any) -> None:
        self.workdir = workdir
        self.docker = docker_client
        self.agents: list[AgentProcess] = []
        self.record = DockerRecord(docker_client, lambda: set(self.hostnames()))
        self.pg = PrivatePostgres()
        self.redis = FaultRedis(workdir)
        self.redis.start()
        self.var_dir = workdir / "var"
        self.var_dir.mkdir()
        self.env = {
            "DATABASE_URL": self.pg.url,
            "REDIS_URL": self.redis.url,
            "API_THROTTLE_USER": "100000/min",
            "LOG_LEVEL": "WARNING",
            **settings,
        }
        self.port = free_port()
        self.control_plane: RunningSystem | None = None
        self.control_planes: list[RunningSystem] = []  # every start, for the logs
        self.start_control_plane()
        shell = self.shell(SETUP % agents)
        self.api_token = next(line.split()[1] for line in shell.splitlines() if line.startswith("api "))
        joins = [line.split()[1] for line in shell.splitlines() if line.startswith("join ")]
        suffix = uuid.uuid4().hex[:6]
        self.agents = [
            AgentProcess(hostname=f"outage-{suffix}-{i}", workdir=workdir / "agents", control_plane_port=self.port)
            for i in range(agents)
        ]
        (workdir / "agents").mkdir()
        for agent, token in zip(self.agents, joins, strict=True):
            agent.start(token)
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {self.api_token}"

    # --- the control plane ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_control_plane(self, *, timeout: float = 240) -> RunningSystem:
        self.control_plane = RunningSystem(self.var_dir, "--no-agents", extra_env=self.env, port=self.port)
        self.control_planes.append(self.control_plane)
        self.control_plane.wait_for(r"0 agents up", timeout=timeout)
        return self.control_plane

    def kill_control_plane(self) -> list[int]:
        assert self.control_plane is not None
        return self.control_plane.kill_all()

    def shell(self, code: str) -> str:
        from tests.runsystem_support import embedded_env

        env = {**embedded_env(self.var_dir, self.port), **self.env}
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def sql(self, query: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg.url, autocommit=True, connect_timeout=5) as db:
            cursor = db.execute(query, list(params))  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    def api_ready(self) -> bool:
        try:
            return self.http.get(f"{self.url}/readyz", timeout=3).status_code == 200
        except requests.RequestException:
            return False

    # --- the fleet --------------------------------------------------------------------------------------------

    def hostnames(self) -> list[str]:
        return [a.hostname for a in self.agents]

    def agent(self, hostname: str) -> AgentProcess:
        return next(a for a in self.agents if a.hostname == hostname)

    def set_states(self, states: dict[str, str]) -> None:
        """Steer placement as an operator would: only ``ready`` servers take bookings."""
        for hostname, state in states.items():
            self.sql("UPDATE inventory_server SET state = %s WHERE hostname = %s", [state, hostname])

    def server_states(self) -> dict[str, str]:
        rows = self.sql("SELECT hostname, state FROM inventory_server WHERE hostname = ANY(%s)", [self.hostnames()])
        return dict(rows)  # type: ignore[arg-type]

    def enrolled(self) -> bool:
        rows = self.sql(
            "SELECT s.hostname, count(g.id) FROM inventory_server s JOIN inventory_gpu g ON g.server_id = s.id "
            "WHERE s.hostname = ANY(%s) GROUP BY s.hostname",
            [self.hostnames()],
        )
        return len(rows) == len(self.agents) and all(n >= GPUS_PER_NODE for _, n in rows)

    # --- reservations ----------------------------------------------------------------------------------------

    def book(self, *, project: str, name: str, start: datetime, end: datetime, gpus: int = 1) -> str:
        body: dict[str, Any] = {
            "project": project,
            "name": name,
            "spec": {"gpu_model": "H100-80GB", "gpu_count": gpus},
            "window": {"start": start.isoformat(), "end": end.isoformat()},
            "container": {"image": DEFAULT_TAG, "command": JOB},
        }
        response = self.http.post(f"{self.url}/api/v1/reservations/", json=body, timeout=30)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def states(self, reservations: Iterable[str]) -> dict[str, str]:
        rows = self.sql(
            "SELECT public_id::text, state FROM reservations_reservation WHERE public_id::text = ANY(%s)",
            [list(reservations)],
        )
        return dict(rows)  # type: ignore[arg-type]

    def release(self, reservation: str) -> requests.Response:
        return self.http.post(f"{self.url}/api/v1/reservations/{reservation}/release/", json={}, timeout=30)

    def release_all(self, *, within: timedelta = timedelta(hours=1)) -> None:
        """End (or cancel) every reservation whose window opens within ``within``, and wait for an idle fleet:
        a case starts from nothing running, whatever the one before left."""
        rows = self.sql(
            "SELECT public_id::text FROM reservations_reservation "
            "WHERE state IN ('pending', 'scheduled', 'starting', 'running') AND starts_at < %s",
            [utcnow() + within],
        )
        for (reservation,) in rows:
            self.release(reservation)
        released = [r for (r,) in rows]
        # Ended in the control plane's books too (the GPUs free for the next booking), not only in Docker.
        wait_for(
            lambda: not set(self.states(released).values()) & {"pending", "scheduled", "starting", "running", "ending"},
            timeout=90,
            what="the released reservations ended",
            detail=lambda: self.states(released),
        )
        wait_for(
            lambda: not [c for c in self.containers() if c.status == "running"],
            timeout=90,
            what="an idle fleet",
            detail=self.containers,
        )

    def ensure_control_plane(self) -> None:
        """The control plane running: started again when a case before left it stopped (it gave up, or the case
        failed between a kill and the start)."""
        if self.control_plane is None or self.control_plane.process.poll() is not None:
            if self.control_plane is not None:
                self.control_plane.stop()
            self.start_control_plane()

    def placed_on(self, reservation: str) -> str | None:
        rows = self.sql(
            "SELECT s.hostname FROM dispatch_launch l JOIN inventory_server s ON s.id = l.server_id "
            "JOIN reservations_reservation r ON r.id = l.reservation_id WHERE r.public_id::text = %s "
            "ORDER BY l.id DESC LIMIT 1",
            [reservation],
        )
        return rows[0][0] if rows else None

    # --- what really ran (Docker's record) --------------------------------------------------------------------

    def containers(self) -> list[Ran]:
        found = []
        for hostname in self.hostnames():
            for c in self.docker.containers.list(all=True, filters={"label": f"{LABEL_NODE}={hostname}"}):
                state = c.attrs["State"]
                started = parse_docker_time(state["StartedAt"])
                if started is None:
                    continue  # created, never started
                finished = parse_docker_time(state["FinishedAt"]) if state["Status"] != "running" else None
                found.append(
                    Ran(
                        name=c.name,
                        reservation=c.labels.get(LABEL_RESERVATION, ""),
                        launch=c.labels.get(LABEL_LAUNCH, ""),
                        node=hostname,
                        status=state["Status"],
                        started=started,
                        finished=finished,
                    )
                )
        return found

    def running_for(self, reservation: str) -> list[Ran]:
        return [c for c in self.containers() if c.reservation == reservation and c.status == "running"]

    def stop_events(self, since: datetime, until: datetime) -> list[dict[str, Any]]:
        """Docker's die/kill/stop events of this fleet's containers between ``since`` and ``until``."""
        hosts = set(self.hostnames())
        events = self.docker.events(
            since=since,
            until=until,
            decode=True,
            filters={"type": "container", "event": list(STOP_EVENTS)},
        )
        return [e for e in events if e.get("Actor", {}).get("Attributes", {}).get(LABEL_NODE) in hosts]

    def remove_containers(self) -> None:
        for hostname in self.hostnames():
            for c in self.docker.containers.list(all=True, filters={"label": f"{LABEL_NODE}={hostname}"}):
                c.remove(force=True)

    def keep_logs(self, directory: Path) -> None:
        """The agents' logs and every runsystem's output, to read a failure after the temp dirs are gone."""
        directory.mkdir(parents=True, exist_ok=True)
        for agent in self.agents:
            if agent.log_path.exists():
                shutil.copy(agent.log_path, directory / agent.log_path.name)
        for i, control_plane in enumerate(self.control_planes):
            (directory / f"runsystem-{i}.log").write_text(control_plane.output)

    def close(self) -> None:
        if keep := os.environ.get("FAULTS_LOG_DIR"):
            self.keep_logs(Path(keep))
        for agent in self.agents:
            agent.stop()
        if self.control_plane is not None:
            if self.control_plane.process.poll() is None:
                self.control_plane.stop()
            else:
                for pid in self.control_plane.leftovers():
                    os.kill(pid, signal.SIGKILL)
        self.remove_containers()
        self.record.close()
        self.redis.stop()
        self.pg.close()


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    interval: float = 0.25,
    detail: Callable[[], object] | None = None,
) -> Any:
    """Poll; a predicate that raises (the database is away) counts as not yet. ``detail`` says what there was
    instead, in the failure."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            if value := predicate():
                return value
        except (psycopg.Error, requests.RequestException, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            seen = f"; instead: {detail()}" if detail is not None else ""
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}{seen}" + (f" (last error: {last})" if last else "")
            )
        time.sleep(interval)


def utcnow() -> datetime:
    return datetime.now(UTC)
