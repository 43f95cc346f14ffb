"""Two control-plane hosts for the two-host fault test: each runs the web server, a Celery worker and a Celery
beat, started as ``runsystem`` starts them (its own argv builders), on one PostgreSQL and one Redis; a TCP load
balancer in front of both webs; real agents (simulated GPUs, the Docker runtime) and booking clients behind the
balancer. ``Host.kill()`` is a lost machine: SIGKILL to every process group of the host at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.faults.partition_support import TcpProxy, free_port

ROOT = Path(__file__).resolve().parent.parent.parent


class LoadBalancer(TcpProxy):
    """A TCP balancer on 127.0.0.1: each new connection goes to the next backend in turn, and to the one after
    it when that one refuses (a dead host), as a balancer's passive health check does. A connection open to a
    backend that dies is reset, and the client's retry lands on a live one."""

    def __init__(self, targets: list[tuple[str, int]]) -> None:
        super().__init__(targets[0])
        self.targets = targets
        self._next = 0

    def _connect(self) -> socket.socket | None:
        for _ in range(len(self.targets)):
            target = self.targets[self._next % len(self.targets)]
            self._next += 1
            try:
                return socket.create_connection(target, timeout=2)
            except OSError:
                continue
        return None

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = self._connect()
            if upstream is None:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), name="lb-pump", daemon=True).start()


class BalancerProcess:
    """The balancer in a process of its own, as a real one is: its pumps do not share this process's GIL with
    the booking clients and the webhook receiver."""

    def __init__(self, targets: list[tuple[str, int]], *, log_path: Path) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "tests.faults.two_hosts_support", str(self.port)]
        argv += [f"{host}:{port}" for host, port in targets]
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the balancer did not start: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


class Host:
    """One control-plane machine: web (gunicorn, as runsystem and compose run it), a Celery worker (threads, as
    runsystem runs it with Redis) and a Celery beat with its own schedule file, each in a process group of
    its own."""

    def __init__(self, name: str, *, var_dir: Path, env: dict[str, str]) -> None:
        from controlplane.system.management.commands.runsystem import Command

        self.name = name
        self.var_dir = var_dir
        var_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        command = Command()
        worker = command.worker_argv()
        worker[worker.index("runsystem@%h")] = f"{name}@%h"  # two workers, two node names
        beat = command.beat_argv()
        beat[beat.index("--schedule") + 1] = str(var_dir / "celerybeat-schedule")  # each beat its own
        self.argvs = {"web": command.web_argv("127.0.0.1", self.port), "worker": worker, "beat": beat}
        self.env = {**env, "CONTROLPLANE_VAR_DIR": str(var_dir), "PYTHONUNBUFFERED": "1"}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, what: str) -> str:
        path = self.var_dir / f"{what}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> Host:
        for what, argv in self.argvs.items():
            with (self.var_dir / f"{what}.log").open("ab") as log:
                self.processes[what] = subprocess.Popen(
                    argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            dead = {what: p.returncode for what, p in self.processes.items() if p.poll() is not None}
            if dead:
                logs = "\n".join(f"--- {what}\n{self.log(what)[-2000:]}" for what in dead)
                raise AssertionError(f"host {self.name}: {dead} exited\n{logs}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=3) as response:  # noqa: S310 - loopback
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"host {self.name} not ready in {timeout}s:\n{self.log('web')[-2000:]}")
            time.sleep(0.3)

    def kill(self) -> None:
        """SIGKILL every process of this host at once: no graceful shutdown, no ack, no unlock."""
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes.values():
            process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


class ContainerStarts:
    """Container starts per launch id, from Docker's event stream, followed live from ``start()`` on: the
    engine keeps only its last 256 events, which other users of the engine would push out of a later read."""

    def __init__(self, docker_client: Any, hostnames: list[str]) -> None:
        from nodeagent.runtime.containers import LABEL_LAUNCH, LABEL_NODE

        self.hostnames = set(hostnames)
        self.per_launch: dict[str, int] = {}
        self._labels = (LABEL_LAUNCH, LABEL_NODE)
        self._stream = docker_client.events(filters={"type": "container", "event": "start"}, decode=True)
        self._thread = threading.Thread(target=self._follow, name="docker-events", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        launch_label, node_label = self._labels
        with contextlib.suppress(Exception):  # the stream closed by stop()
            for event in self._stream:
                labels = event.get("Actor", {}).get("Attributes", {})
                if labels.get(node_label) in self.hostnames and labels.get(launch_label):
                    launch = labels[launch_label]
                    self.per_launch[launch] = self.per_launch.get(launch, 0) + 1

    def stop(self) -> dict[str, int]:
        time.sleep(1)  # the last events on their way
        self._stream.close()
        self._thread.join(timeout=10)
        return dict(self.per_launch)


class FleetAgent:
    """A real agent, in a process of its own as on a real node (``python -m nodeagent run``): simulated GPUs,
    the Docker runtime, heartbeats to ``url`` (the balancer)."""

    def __init__(self, *, url: str, state: Path, hostname: str, join_token: str, spec: str) -> None:
        self.hostname = hostname
        state.mkdir(parents=True, exist_ok=True)
        self.log_path = state / "agent.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        env.update(NODEAGENT_JOIN_TOKEN=join_token, PYTHONUNBUFFERED="1")
        argv = [
            sys.executable, "-m", "nodeagent", "run", "--server", url, "--simulate", spec, "--hostname", hostname,
            "--state-dir", str(state), "--runtime", "docker", "--no-ssh", "--no-live-logs",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def host_env(*, database_url: str, redis_url: str, extra: dict[str, str]) -> dict[str, str]:
    """What every host of one control plane shares: the database, Redis, the secret key and the settings."""
    env = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "CELERY_TASK_ALWAYS_EAGER"}}
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        PYTHONPATH=str(ROOT),
        SECRET_KEY="two-hosts-test-key-" + "x" * 40,
        **extra,
    )
    return env


if __name__ == "__main__":  # the balancer's own process: PORT HOST:PORT...
    balancer = LoadBalancer([(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in sys.argv[2:]])
    balancer.port = int(sys.argv[1])
    balancer.start()
    threading.Event().wait()  # until SIGTERM, whose default action ends the process
