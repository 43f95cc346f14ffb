"""Starting a real ``manage.py runsystem`` from a test: its environment, and a handle that reads its output."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def embedded_env(var_dir: Path, port: int) -> dict[str, str]:
    """The system on its embedded defaults (SQLite and the filesystem broker in ``var_dir``), whatever leg of
    the suite runs it: a test of runsystem must not share the suite's database or Redis."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}}
    env.update(CONTROLPLANE_VAR_DIR=str(var_dir), RUNSYSTEM_BIND=f"127.0.0.1:{port}", PYTHONUNBUFFERED="1")
    return env


def runsystem_argv(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), "runsystem", "--no-frontend", *args]


class RunningSystem:
    """A ``runsystem`` in the background whose output lines are collected as they come."""

    def __init__(
        self, var_dir: Path, *args: str, extra_env: dict[str, str] | None = None, port: int | None = None
    ) -> None:
        self.var_dir = var_dir
        # A given port: a system started again where its agents (and their proxies) expect it.
        self.port = port or free_port()
        env = {**embedded_env(var_dir, self.port), **(extra_env or {})}
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            runsystem_argv(*args),
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, *, timeout: float, after: int = 0) -> re.Match[str]:
        """The first line from index ``after`` on that matches ``pattern``; fails with the output's tail."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[after:]:
                    if match := regex.search(line):
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    tail = "\n".join(self.lines[-60:])
                    raise AssertionError(f"no line matching {pattern!r} within {timeout:.0f}s; output ends:\n{tail}")
                self._changed.wait(timeout=min(left, 0.5))

    def mark(self) -> int:
        """Where the output is now, for ``wait_for(after=...)``."""
        with self._changed:
            return len(self.lines)

    def pid_of(self, child: str, *, after: int = 0, timeout: float = 60) -> int:
        """The pid runsystem logged for the first (re)start of ``child`` from line ``after`` on."""
        match = self.wait_for(
            rf"^runsystem +\| {re.escape(child)} (?:re)?started \(pid (\d+)", timeout=timeout, after=after
        )
        return int(match[1])

    def stop(self, *, timeout: float = 60) -> int:
        """SIGTERM, as Ctrl-C would; SIGKILL if it does not exit in time. The exit status.

        Whatever of the system is still running after that (runsystem's children live in sessions of their
        own, so a killed runsystem leaves them behind) is killed too: they are known by the var dir in their
        environment, which is this test's own.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._reader.join(timeout=10)
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.process.returncode

    def kill_all(self) -> list[int]:
        """SIGKILL runsystem and, at once, every process of this system (web, worker, beat), as a host crash or
        the OOM killer would: nothing gets to shut down cleanly. The pids killed."""
        victims = [self.process.pid, *(pid for pid in self.leftovers() if pid != self.process.pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)
        self._reader.join(timeout=10)
        for pid in self.leftovers():  # one forked in between (a gunicorn worker, a restart) goes too
            os.kill(pid, signal.SIGKILL)
        return victims

    def leftovers(self) -> list[int]:
        """The processes still running with this system's var dir in their environment."""
        marker = f"CONTROLPLANE_VAR_DIR={self.var_dir}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:  # gone, or not ours to read
                continue
            if marker in environ.split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
        return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count: it has died and only waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in {"Z", "X"}
