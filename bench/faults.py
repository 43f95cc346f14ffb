"""Faults through the whole system: what each costs the tenants' running work, and a Redis outage and a
PostgreSQL restart under booking clients.

    .venv/bin/python bench/faults.py [--phases redis,postgres,outages] [--outage 20]
                                     [--faults web,control-plane,postgres-stop,partition,agent-kill,agent-stop]
                                     [--clients 8] [--redis-outage 60] [--calm 20] [--after 30]

The outages phase (tests/faults/outage_support.py's system: ``runsystem --no-agents`` on a private PostgreSQL
and Redis, three agent processes with simulated H100s and the real Docker engine, each behind TCP proxies;
lease 4 s, offline 6 s, requeue 8 s after the last heartbeat, the outage tolerance at its default) runs a round
per fault: two jobs nothing would replace and one replaceable job (its project opted in to requeue) running, the
replaceable one and one of the others on the node a node fault hits; then the fault for ``--outage`` seconds:
runsystem's web child SIGKILLed once (it is restarted), every control-plane process SIGKILLed, the PostgreSQL
cluster stopped, that node cut off by its proxies, its agent SIGKILLed, its agent SIGSTOPped; then everything
back. Per fault it prints the seconds the API gave no 2xx (a client reading every 0.2 s), the containers
stopped (Docker's die events; non-replaceable and replaceable apart), the reservations interrupted, and the
duplicates (a reservation and its follow-up with two containers running at one instant, from Docker's
StartedAt/FinishedAt), beside the baseline: the same round with no fault, in the same run. Goals: 0 stopped and
0 interrupted but the silent node's replaceable job (fenced at its lease, requeued elsewhere), 0 duplicates.

Nothing shared is touched: the bench starts a PostgreSQL cluster of its own (initdb, run as the ``postgres``
system user when started as root) and a redis-server of its own, each on a free 127.0.0.1 port, and runs
``manage.py runsystem`` on them: gunicorn, a Celery worker and beat, and two agents with simulated H100s and
the real Docker engine (it needs one, and the local test image: scripts/build-test-image).

``--clients`` threads, each with a keep-alive connection and the same project's API token, book one GPU for a
short window that opens two seconds later (one booking every ``--pace`` seconds each) and read the booking back.
The redis and postgres phases run on a system of their own (runsystem with its agents). Each phase is a calm
stretch (the baseline, same run), the fault, and a stretch after it:

- redis: redis-server is stopped for ``--redis-outage`` seconds, then started again on the same port, empty
  (no persistence: the harsher case, every queued task is gone);
- postgres: the cluster is restarted (``pg_ctl restart -m fast``), every connection dropped.

Per stretch it prints the requests made, their 2xx, 4xx and 5xx, and for PostgreSQL the 5xx after the first
second back. From Docker's own events it prints how late containers started after their window opened, the
seconds after the fault until every window that opened during it had its container (catch-up; 0 when launches
never fell behind), and the duplicate (two containers for one reservation) and lost (a booked window that
ended with no container) reservations. Goals: 0 5xx during the Redis outage, 0 after the first second of
PostgreSQL, 0 duplicates, 0 lost.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import ROOT, free_port, pct

PY = str(ROOT / ".venv/bin/python")
HOSTS = ("fault-a", "fault-b")
IMAGE = "gpucp-busybox:test"
# The job traps SIGTERM so a stop at the window's end is prompt and clean.
JOB = ["sh", "-c", 'trap "exit 0" TERM; while true; do sleep 0.2; done']


# --- private services ---------------------------------------------------------------------------------------


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the postgres system user then."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for directory in versions:
        if (directory / name).exists():
            return str(directory / name)
    raise SystemExit(f"bench/faults.py needs PostgreSQL's {name} (Debian: apt-get install postgresql)")


class PrivatePostgres:
    def __init__(self, workdir: Path) -> None:
        self.data = workdir / "pgdata"
        self.port = free_port()
        self.data.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(workdir, "postgres")
            shutil.chown(self.data, "postgres")
        subprocess.run(
            _as_postgres([_pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
            check=True,
            capture_output=True,
        )
        self.options = f"-p {self.port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._ctl("start")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, action: str, *extra: str) -> None:
        argv = [_pg_bin("pg_ctl"), "-D", str(self.data), "-o", self.options, "-w", "-l", str(self.data / "log")]
        subprocess.run(_as_postgres([*argv, action, *extra]), check=True, capture_output=True)

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        try:
            self._ctl("stop", "-m", "immediate")
        except subprocess.CalledProcessError:
            pass


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout.strip() == (
                b"PONG"
            ):
                return
            time.sleep(0.1)
        raise SystemExit("the bench's redis-server did not come up")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


# --- the system under test ----------------------------------------------------------------------------------


def manage(env: dict[str, str], code: str) -> str:
    done = subprocess.run(
        [PY, "manage.py", "shell", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py shell failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip()


SETUP = """
from decimal import Decimal
from django.contrib.auth import get_user_model
from controlplane.accounts.choices import Role
from controlplane.accounts.models import Membership, Project
from controlplane.accounts.services import api_token_create
from controlplane.ledger import services as ledger
user, _ = get_user_model().objects.get_or_create(username="bench-faults")
project, _ = Project.objects.get_or_create(slug="bench-faults", defaults={"name": "Fault bench"})
Membership.objects.get_or_create(project=project, user=user, defaults={"role": Role.OWNER})
ledger.quota_policy_set(project=project, actor=None, credits_per_period=Decimal("100000"),
                        max_concurrent_gpus=64, max_reservation_hours=Decimal("1"))
ledger.ledger_grant_period(project=project)
print(api_token_create(user=user, name="bench")[1])
"""

READY = """
from controlplane.inventory.models import Server
print(Server.objects.filter(hostname__in=%r, state="ready").count())
"""


def start_system(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(
        [PY, "manage.py", "runsystem", "--no-frontend", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_ready(env: dict[str, str], system: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if system.poll() is not None:
            raise SystemExit(f"runsystem exited with {system.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if manage(env, READY % (list(HOSTS),)).splitlines()[-1:] == [str(len(HOSTS))]:
                return
        except (SystemExit, ValueError):
            pass
        time.sleep(2)
    raise SystemExit(f"the agents did not come up:\n{log.read_text()[-3000:]}")


# --- load and observation -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    at: float  # monotonic
    kind: str  # "book" or "read"
    status: int  # 0: no HTTP answer at all
    json_body: bool


@dataclass
class Booking:
    reservation: str
    window_start: datetime
    window_end: datetime


@dataclass
class Load:
    port: int
    token: str
    clients: int
    pace_s: float
    window_s: float
    outcomes: list[Outcome] = field(default_factory=list)
    bookings: list[Booking] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        n = 0
        while not self.stop.is_set():
            began = time.monotonic()
            n += 1
            start = datetime.now(UTC) + timedelta(seconds=2)
            end = start + timedelta(seconds=self.window_s)
            body = {
                "project": "bench-faults",
                "name": f"c{index}-{n}",
                "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
                "window": {"start": start.isoformat(), "end": end.isoformat()},
                "container": {"image": IMAGE, "command": JOB},
            }
            keyed = {**headers, "Idempotency-Key": f"bench-{index}-{n}-{start.timestamp()}"}
            status, data, conn = self._call(conn, "POST", "/api/v1/reservations/", keyed, json.dumps(body))
            self._record("book", status, data)
            if status == 201 and isinstance(data, dict) and data.get("id"):
                with self.lock:
                    self.bookings.append(Booking(str(data["id"]), start, end))
                status, data, conn = self._call(conn, "GET", f"/api/v1/reservations/{data['id']}/", headers, None)
                self._record("read", status, data)
            self.stop.wait(max(0.0, self.pace_s - (time.monotonic() - began)))
        conn.close()

    def _call(
        self, conn: http.client.HTTPConnection, method: str, path: str, headers: dict[str, str], body: str | None
    ) -> tuple[int, object, http.client.HTTPConnection]:
        # Once more on a fresh connection when the kept-alive one fails: gunicorn closes idle ones after its
        # keep-alive timeout, as HTTP clients expect. A booking carries an Idempotency-Key, so the second try
        # can never book twice.
        for attempt in (1, 2):
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt == 2:
                    return 0, None, conn
        try:
            return response.status, json.loads(raw), conn
        except ValueError:
            return response.status, None, conn

    def _record(self, kind: str, status: int, data: object) -> None:
        with self.lock:
            self.outcomes.append(Outcome(time.monotonic(), kind, status, isinstance(data, (dict, list))))


class DockerWatch:
    """Container starts per reservation, from the engine's own event stream: what really ran."""

    def __init__(self) -> None:
        import docker

        self.client = docker.from_env(timeout=30)
        self.starts: dict[str, list[tuple[str, datetime]]] = defaultdict(list)
        self._since = datetime.now(UTC)
        self._events = self.client.events(decode=True, filters={"type": "container", "event": "start"})
        threading.Thread(target=self._run, daemon=True, name="docker-events").start()

    def _run(self) -> None:
        try:
            for event in self._events:
                labels = event.get("Actor", {}).get("Attributes", {})
                reservation = labels.get("gpucp.reservation")
                if reservation and labels.get("gpucp.node") in HOSTS:
                    at = datetime.fromtimestamp(event["timeNano"] / 1e9, UTC)
                    self.starts[reservation].append((event["id"], at))
        except Exception:  # the stream closes when the bench ends
            return

    def close(self) -> None:
        self._events.close()

    def remove_ours(self) -> None:
        for node in HOSTS:
            for container in self.client.containers.list(all=True, filters={"label": f"gpucp.node={node}"}):
                container.remove(force=True)


# --- the run ------------------------------------------------------------------------------------------------


@dataclass
class Stretch:
    name: str
    begin: float  # monotonic
    end: float
    wall_begin: datetime
    wall_end: datetime


def report(
    phase: str, stretches: list[Stretch], load: Load, watch: DockerWatch, *, fault_end: tuple[float, datetime]
) -> None:
    print(f"\n== {phase}")
    print(f"{'stretch':<10} {'requests':>8} {'2xx':>6} {'4xx':>5} {'5xx':>5} {'no answer':>9} {'not JSON':>8}")
    for s in stretches:
        got = [o for o in load.outcomes if s.begin <= o.at < s.end]

        def count(lo: int, hi: int, got: list[Outcome] = got) -> int:
            return sum(1 for o in got if lo <= o.status < hi)

        print(
            f"{s.name:<10} {len(got):>8} {count(200, 300):>6} {count(400, 500):>5} {count(500, 600):>5} "
            f"{count(0, 1):>9} {sum(1 for o in got if o.status and not o.json_body):>8}"
        )
    if phase == "postgres":
        back = fault_end[0]
        late = [o for o in load.outcomes if o.at >= back + 1.0 and o.status >= 500]
        print(f"5xx after the first second back: {len(late)} (goal 0)")
    print(f"{'windows opening':<22} {'launched':>8} {'p50 late s':>10} {'p95 late s':>10} {'max late s':>10}")
    for s in stretches:
        delays = []
        opened = [b for b in load.bookings if s.wall_begin <= b.window_start < s.wall_end]
        for b in opened:
            starts = watch.starts.get(b.reservation)
            if starts:
                delays.append((min(at for _, at in starts) - b.window_start).total_seconds())
        print(
            f"{'in ' + s.name:<22} {len(delays):>4}/{len(opened):<3} {pct(delays, 0.5):>10.2f} "
            f"{pct(delays, 0.95):>10.2f} {max(delays, default=float('nan')):>10.2f}"
        )
    fault = next(s for s in stretches if s.name == "fault")
    during = [b for b in load.bookings if fault.wall_begin <= b.window_start < fault.wall_end]
    firsts = [min(at for _, at in watch.starts[b.reservation]) for b in during if watch.starts.get(b.reservation)]
    catch_up = max([(at - fault_end[1]).total_seconds() for at in firsts], default=0.0)
    print(f"catch-up after the fault: {max(0.0, catch_up):.1f} s ({len(firsts)}/{len(during)} windows of the fault)")


# --- outages: what each fault costs the tenants' running work -----------------------------------------------

OUTAGE_FAULTS = ("web", "control-plane", "postgres-stop", "partition", "agent-kill", "agent-stop")
OUTAGE_SETTINGS = {  # as tests/faults/test_outages.py: lease 4 s, offline 6 s, requeue 8 s after silence
    "FLEET_HEARTBEAT_INTERVAL_S": "1",
    "FLEET_FENCE_AFTER_INTERVALS": "4",
    "FLEET_OFFLINE_AFTER_INTERVALS": "6",
    "DISPATCH_STOP_GRACE_S": "2",
    "FLEET_REQUEUE_MARGIN_S": "2",
    "DISPATCH_WARN_BEFORE_S": "0",
    "DISPATCH_REQUEUE_MIN_S": "5",
    "FLEET_STARTUP_GRACE_S": "10",
}


class Prober:
    """An API client reading one page of reservations every 0.2 s; the seconds it got no 2xx."""

    def __init__(self, url: str, token: str) -> None:
        import requests

        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.url = f"{url}/api/v1/reservations/?page_size=1"
        self.samples: list[tuple[float, bool]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="prober")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            at = time.monotonic()
            try:
                ok = self.session.get(self.url, timeout=2).status_code < 300
            except Exception:
                ok = False
            self.samples.append((at, ok))
            self.stop.wait(max(0.0, 0.2 - (time.monotonic() - at)))

    def unavailable_s(self, begin: float, end: float) -> float:
        """Seconds between ``begin`` and ``end`` from each failed probe to the next probe."""
        got = [(at, ok) for at, ok in self.samples if begin <= at <= end]
        return sum(b[0] - a[0] for a, b in itertools.pairwise(got) if not a[1])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


@dataclass
class Cost:
    fault: str
    api_unavailable_s: float
    stopped_kept: int  # containers of non-replaceable work stopped (goal 0)
    stopped_replaceable: int  # containers of replaceable work stopped (expected on a silent node: the fence)
    interrupted: int
    duplicates: int  # a reservation (with its follow-up) with two containers running at one instant (goal 0)
    outage_s: float


def outage_round(system: object, prober: Prober, fault: str, outage_s: float) -> Cost:
    """Two non-replaceable jobs and one replaceable one, the replaceable one and a non-replaceable one on the
    first node (the one a node fault hits); the fault for ``outage_s`` (the web child: one SIGKILL, restarted
    by runsystem); then everything back; its cost from Docker's events and the control plane's records."""
    from tests.faults.outage_support import System, utcnow, wait_for

    assert isinstance(system, System)
    a, b, c = system.hostnames()
    system.ensure_control_plane()
    system.release_all()
    system.set_states({a: "ready", b: "maintenance", c: "maintenance"})
    now = utcnow()
    end = now + timedelta(hours=1)
    kept = [system.book(project="faults", name=f"{fault}-kept-0", start=now + timedelta(seconds=1), end=end)]
    replaceable = system.book(
        project="faults-requeue", name=f"{fault}-replaceable", start=now + timedelta(seconds=1), end=end
    )
    wait_for(lambda: system.placed_on(replaceable) == a and system.placed_on(kept[0]) == a, timeout=30, what="on a")
    system.set_states({b: "ready"})
    kept.append(system.book(project="faults", name=f"{fault}-kept-1", start=utcnow() + timedelta(seconds=1), end=end))
    mine = [*kept, replaceable]
    wait_for(
        lambda: all(system.running_for(r) for r in mine),
        timeout=90,
        what="three containers running",
        detail=lambda: (system.states(mine), {r: system.placed_on(r) for r in mine}, system.containers()),
    )
    system.set_states({c: "ready"})
    victim = system.agent(a)
    cp = system.control_plane
    assert cp is not None

    began, since = time.monotonic(), utcnow()
    if fault == "web":
        import re

        mark = cp.mark()
        os.kill(int(re.findall(r"web (?:re)?started \(pid (\d+)", cp.output)[-1]), signal.SIGKILL)
        cp.pid_of("web", after=mark, timeout=60)
        wait_for(system.api_ready, timeout=120, what="the web server back")
    elif fault == "control-plane":
        system.kill_control_plane()
        time.sleep(outage_s)
        system.start_control_plane()
    elif fault == "postgres-stop":
        system.pg.stop()
        time.sleep(outage_s)
        system.pg.start()
    elif fault == "partition":
        victim.partition()
        time.sleep(outage_s)
        victim.heal()
    elif fault == "agent-kill":
        victim.kill()
        time.sleep(outage_s)
        victim.start()
    elif fault == "agent-stop":
        victim.freeze()
        time.sleep(outage_s)
        victim.thaw()
    elif fault != "none":
        raise SystemExit(f"unknown fault {fault!r}")
    took = time.monotonic() - began
    returned = utcnow()
    wait_for(
        lambda: (
            system.sql(
                "SELECT count(*) FROM inventory_server WHERE hostname = ANY(%s) AND last_heartbeat_at > %s",
                [system.hostnames(), returned],
            )[0][0]
            == 3
        ),
        timeout=120,
        what="every agent heard again",
    )
    wait_for(system.api_ready, timeout=60, what="the API")
    time.sleep(5)
    ended = time.monotonic()

    events = system.stop_events(since, utcnow())
    stopped = {e["Actor"]["Attributes"].get("gpucp.reservation") for e in events if e["Action"] == "die"}
    states = system.states(mine)
    follow_ups = dict(
        system.sql(
            "SELECT i.public_id::text, f.public_id::text FROM dispatch_requeue q "
            "JOIN reservations_reservation f ON f.id = q.follow_up_id "
            "JOIN reservations_reservation i ON i.id = q.interrupted_id WHERE i.public_id::text = ANY(%s)",
            [mine],
        )
    )
    duplicates = 0
    forever = datetime.max.replace(tzinfo=UTC)
    for reservation in mine:
        lineage = [reservation, *([follow_ups[reservation]] if reservation in follow_ups else [])]
        spans = sorted((x.started, x.finished or forever) for r in lineage for x in system.record.of(r))
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
            duplicates += 1
    return Cost(
        fault=fault,
        api_unavailable_s=prober.unavailable_s(began, ended),
        stopped_kept=sum(1 for r in kept if r in stopped),
        stopped_replaceable=int(replaceable in stopped),
        interrupted=sum(1 for state in states.values() if state == "interrupted"),
        duplicates=duplicates,
        outage_s=took,
    )


def run_outages(faults: list[str], outage_s: float) -> None:
    """Each fault in turn on one system (tests/faults/outage_support.py: runsystem without agents on a private
    PostgreSQL and Redis, three agent processes behind TCP proxies), after a no-fault round of the same shape,
    the baseline."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-faults-django-"))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    import docker

    from tests.faults.outage_support import System, wait_for

    workdir = Path(tempfile.mkdtemp(prefix="bench-outages-"))
    client = docker.from_env(timeout=60)
    system = System(workdir, settings=OUTAGE_SETTINGS, agents=3, docker_client=client)
    prober: Prober | None = None
    costs: list[Cost] = []
    try:
        wait_for(system.enrolled, timeout=180, what="three agents enrolled")
        prober = Prober(system.url, system.api_token)
        for fault in ["none", *faults]:
            cost = outage_round(system, prober, fault, outage_s if fault != "none" else 0.0)
            costs.append(cost)
            print(f"  {fault}: done ({cost.outage_s:.1f} s)", flush=True)
    finally:
        if prober is not None:
            prober.close()
        system.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\noutages of {outage_s:g} s (lease 4 s, offline 6 s, requeue 8 s after the last heartbeat); per fault, two "
        "non-replaceable jobs and one replaceable job (requeue on), the replaceable one and a non-replaceable one "
        "on the node a node fault hits; baseline: the same round with no fault ('none')"
    )
    print(
        f"{'fault':<14} {'fault s':>7} {'API away s':>10} {'stopped (kept)':>14} {'stopped (repl.)':>15} "
        f"{'interrupted':>11} {'duplicates':>10}"
    )
    for cost in costs:
        print(
            f"{cost.fault:<14} {cost.outage_s:>7.1f} {cost.api_unavailable_s:>10.1f} {cost.stopped_kept:>14} "
            f"{cost.stopped_replaceable:>15} {cost.interrupted:>11} {cost.duplicates:>10}"
        )
    print("goals: 0 stopped (kept) and 0 interrupted but for the replaceable job of a silent node; 0 duplicates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--pace", type=float, default=8.0, help="seconds between one client's bookings")
    parser.add_argument("--window", type=float, default=15.0, help="seconds each booked window lasts")
    parser.add_argument("--redis-outage", type=float, default=60.0)
    parser.add_argument("--calm", type=float, default=20.0, help="seconds of baseline before each fault")
    parser.add_argument("--after", type=float, default=30.0, help="seconds measured after each fault")
    parser.add_argument("--phases", default="redis,postgres,outages")
    parser.add_argument("--outage", type=float, default=20.0, help="seconds each outage of the outages phase lasts")
    parser.add_argument("--faults", default=",".join(OUTAGE_FAULTS), help="the outages phase's faults")
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if "outages" in phases:
        phases.remove("outages")
        run_outages([f.strip() for f in args.faults.split(",") if f.strip()], args.outage)
        if not phases:
            return

    workdir = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    pg = PrivatePostgres(workdir)
    redis = PrivateRedis()
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": pg.url,
        "REDIS_URL": redis.url,
        "CONTROLPLANE_VAR_DIR": str(workdir / "var"),
        "RUNSYSTEM_FLEET": ",".join(f"{h}=8xH100-80GB" for h in HOSTS),
        "DISPATCH_WARN_BEFORE_S": "0",
        "DISPATCH_STOP_GRACE_S": "2",
        "API_THROTTLE_USER": "100000/min",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    log = workdir / "runsystem.log"
    system: subprocess.Popen[bytes] | None = None
    watch: DockerWatch | None = None
    load: Load | None = None
    threads: list[threading.Thread] = []
    try:
        subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        token = manage(env, SETUP).splitlines()[-1]
        watch = DockerWatch()
        system = start_system(env, port, log)
        wait_ready(env, system, log)
        print(f"system up: runsystem on 127.0.0.1:{port}, PostgreSQL :{pg.port}, Redis :{redis.port}")
        load = Load(port=port, token=token, clients=args.clients, pace_s=args.pace, window_s=args.window)
        threads = [threading.Thread(target=load.client, args=(i,), daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()

        def stretch(name: str, seconds: float, action: object = None) -> Stretch:
            begin, wall = time.monotonic(), datetime.now(UTC)
            if callable(action):
                action()
            time.sleep(max(0.0, seconds - (time.monotonic() - begin)))
            return Stretch(name, begin, time.monotonic(), wall, datetime.now(UTC))

        results = []
        for phase in phases:
            calm = stretch("calm", args.calm)
            if phase == "redis":
                fault = stretch("fault", args.redis_outage, redis.stop)
                redis.start()
            elif phase == "postgres":
                fault = stretch("fault", 0.0, pg.restart)
            else:
                raise SystemExit(f"unknown phase {phase!r}")
            fault_end = (time.monotonic(), datetime.now(UTC))
            after = stretch("after", args.after)
            results.append((phase, [calm, fault, after], fault_end))
        load.stop.set()
        for t in threads:
            t.join(timeout=35)
        # The last windows end and their containers stop before the tally.
        time.sleep(args.window + 6)

        print(f"\n{args.clients} clients, one booking each every {args.pace:g} s, {args.window:g} s windows")
        for phase, stretches, fault_end in results:
            report(phase, stretches, load, watch, fault_end=fault_end)
        ended = [b for b in load.bookings if b.window_end < datetime.now(UTC) - timedelta(seconds=4)]
        duplicates = sum(1 for b in load.bookings if len({cid for cid, _ in watch.starts.get(b.reservation, [])}) > 1)
        lost = sum(1 for b in ended if not watch.starts.get(b.reservation))
        print(f"\nreservations booked: {len(load.bookings)}; duplicate containers: {duplicates} (goal 0); "
              f"lost (window ended, no container): {lost} of {len(ended)} ended (goal 0)")  # fmt: skip
        alive = system.poll() is None
        print(f"runsystem still running at the end: {'yes' if alive else f'no (exit {system.returncode})'}")
        restarts = [line for line in log.read_text(errors="replace").splitlines() if "restart" in line.lower()]
        print(f"child restarts logged: {len(restarts)}")
        for line in restarts[:10]:
            print(f"  {line}")
    finally:
        if load is not None:
            load.stop.set()
        if system is not None and system.poll() is None:
            os.killpg(system.pid, signal.SIGTERM)
            try:
                system.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(system.pid, signal.SIGKILL)
        if watch is not None:
            watch.close()
            watch.remove_ours()
        redis.stop()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
