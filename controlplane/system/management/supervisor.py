"""A small process supervisor: child processes with prefixed output, restarts with backoff, an orderly stop.

Each child runs in its own session (process group), so a Ctrl-C in the terminal reaches only the supervisor,
which then stops the children in the order it chooses; and a signal to the group also reaches what the child
started itself (gunicorn's workers, for one).

A child that dies on its own is started again after a backoff, so one crash costs that child's work for a
second or two instead of stopping the whole system. Only a crash loop (``crash_loop_deaths`` deaths of one
child within ``crash_loop_window_s``) gives up: ``poll()`` raises ``CrashLoop`` and the caller stops the rest.

Why not supervisord, circus or honcho: none of them does both the restart policy here (exponential backoff for
a child that ran and died, a crash loop that stops everything) and the name-prefixed output without a second
layer of glue; docs/operations.md ("runsystem's children") says what each lacks.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

from nodeagent.client import Backoff

Env = dict[str, str]


@dataclass(frozen=True)
class RestartPolicy:
    """When a child that died is started again, and how many deaths mean it will not stay up."""

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    # A child that ran this long before it died had come up fine: its next restart is quick again.
    healthy_after_s: float = 30.0
    crash_loop_deaths: int = 5
    crash_loop_window_s: float = 60.0


def describe_exit(returncode: int) -> str:
    """``exit status 3`` or ``killed by SIGKILL``, from a ``Popen.returncode``."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


@dataclass(eq=False)
class Child:
    name: str
    argv: Sequence[str]
    process: subprocess.Popen[bytes]
    reader: threading.Thread
    started_at: float
    backoff: Backoff
    env: Env | None = None
    # Made again before each restart (an agent's join token, say); ``env`` is used when there is none.
    restart_env: Callable[[], Env | None] | None = None
    deaths: deque[float] = field(default_factory=deque)
    # Set while the child is dead and waits for its backoff to pass.
    restart_at: float | None = None
    restarts: int = 0
    last_exit: str = ""
    expected_exit: bool = False


class CrashLoop(Exception):
    """One child died too often too fast: restarting it again would only hide why."""

    def __init__(self, child: Child, window_s: float) -> None:
        self.child = child
        super().__init__(
            f"{child.name} died {len(child.deaths)} times within {window_s:.0f}s (last: {child.last_exit})"
        )


@dataclass
class Supervisor:
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    env: Env | None = None
    cwd: str | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    clock: Callable[[], float] = time.monotonic
    # Backoff's jitter; the tests fix it to read exact delays.
    rng: Callable[[], float] = random.random
    children: list[Child] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def say(self, name: str, line: str) -> None:
        width = max([len(c.name) for c in self.children] + [len(name), 6])
        with self._lock:
            self.out.write(f"{name:<{width}} | {line.rstrip()}\n")
            self.out.flush()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Env | None = None,
        restart_env: Callable[[], Env | None] | None = None,
    ) -> Child:
        process = self._spawn(argv, env)
        child = Child(
            name=name,
            argv=list(argv),
            process=process,
            reader=self._pump_thread(name, process),
            started_at=self.clock(),
            backoff=Backoff(base_s=self.policy.first_delay_s, cap_s=self.policy.max_delay_s, rng=self.rng),
            env=env,
            restart_env=restart_env,
        )
        self.children.append(child)
        self.say("runsystem", f"{name} started (pid {process.pid})")
        return child

    def poll(self) -> None:
        """Note every child that died since the last call, and start again each one whose backoff has passed.

        Raises ``CrashLoop`` for a child that died ``crash_loop_deaths`` times within the window; the caller
        then stops the others.
        """
        for child in self.children:
            if child.expected_exit:
                continue
            if child.restart_at is None:
                returncode = child.process.poll()
                if returncode is not None:
                    self._died(child, describe_exit(returncode))
            elif self.clock() >= child.restart_at:
                self._restart(child)

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop every child, the last started first: SIGTERM, wait up to ``grace_s``, then SIGKILL."""
        for child in self.children:
            # Also those waiting for a restart: a stop means none happens.
            child.expected_exit = True
        running = [c for c in reversed(self.children) if c.process.poll() is None]
        for child in running:
            self._signal(child, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in running:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say("runsystem", f"{child.name} did not stop within {grace_s:.0f}s; killing it")
                self._signal(child, signal.SIGKILL)
                child.process.wait()
        for child in self.children:
            # Whatever the group left behind (a worker that outlived its parent) goes too.
            self._signal(child, signal.SIGKILL)
            child.reader.join(timeout=2)

    # --- restarts ---------------------------------------------------------------------------------------

    def _died(self, child: Child, how: str, *, reap_group: bool = True) -> None:
        now = self.clock()
        if reap_group:
            # What the child started is orphaned now and may hold what its successor needs (gunicorn's
            # workers keep the listening socket), so it goes before anything else.
            self._signal(child, signal.SIGKILL)
        ran_s = now - child.started_at
        child.last_exit = how
        child.deaths.append(now)
        while now - child.deaths[0] > self.policy.crash_loop_window_s:
            child.deaths.popleft()
        if len(child.deaths) >= self.policy.crash_loop_deaths:
            self.say("runsystem", f"{child.name} died ({how}) after {ran_s:.1f}s; it is crash-looping")
            raise CrashLoop(child, self.policy.crash_loop_window_s)
        if ran_s >= self.policy.healthy_after_s:
            child.backoff.reset()
        delay = child.backoff.failure()
        child.restart_at = now + delay
        self.say("runsystem", f"{child.name} died ({how}) after {ran_s:.1f}s; restarting it in {delay:.1f}s")

    def _restart(self, child: Child) -> None:
        try:
            env = child.restart_env() if child.restart_env is not None else child.env
        except Exception as exc:  # e.g. the database is down: not the child's fault, so not one of its deaths
            delay = child.backoff.failure()
            child.restart_at = self.clock() + delay
            self.say("runsystem", f"{child.name}: cannot prepare its restart ({exc}); trying again in {delay:.1f}s")
            return
        try:
            process = self._spawn(child.argv, env)
        except OSError as exc:
            child.restart_at, child.started_at = None, self.clock()
            self._died(child, f"could not start: {exc}", reap_group=False)
            return
        child.process = process
        child.reader = self._pump_thread(child.name, process)
        child.started_at = self.clock()
        child.restart_at = None
        child.restarts += 1
        self.say("runsystem", f"{child.name} restarted (pid {process.pid}; restart {child.restarts})")

    # --- processes --------------------------------------------------------------------------------------

    def _spawn(self, argv: Sequence[str], env: Env | None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env if env is not None else self.env,
            cwd=self.cwd,
            start_new_session=True,
        )

    def _pump_thread(self, name: str, process: subprocess.Popen[bytes]) -> threading.Thread:
        reader = threading.Thread(target=self._pump, args=(name, process), daemon=True, name=f"pump-{name}")
        reader.start()
        return reader

    def _pump(self, name: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self.say(name, raw.decode("utf-8", errors="replace"))
        process.stdout.close()

    @staticmethod
    def _signal(child: Child, sig: signal.Signals) -> None:
        try:
            os.killpg(child.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
