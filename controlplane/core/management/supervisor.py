"""A small process supervisor: child processes with prefixed output and an orderly stop.

Each child runs in its own session (process group), so a Ctrl-C in the terminal reaches only the supervisor,
which then stops the children in the order it chooses; and a signal to the group also reaches what the child
started itself (gunicorn's workers, for one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    process: subprocess.Popen[bytes]
    reader: threading.Thread
    expected_exit: bool = False


@dataclass
class Supervisor:
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    env: dict[str, str] | None = None
    cwd: str | None = None
    children: list[Child] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def say(self, name: str, line: str) -> None:
        width = max([len(c.name) for c in self.children] + [len(name), 6])
        with self._lock:
            self.out.write(f"{name:<{width}} | {line.rstrip()}\n")
            self.out.flush()

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Child:
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env if env is not None else self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        reader = threading.Thread(target=self._pump, args=(name, process), daemon=True, name=f"pump-{name}")
        child = Child(name=name, argv=list(argv), process=process, reader=reader)
        self.children.append(child)
        reader.start()
        return child

    def _pump(self, name: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self.say(name, raw.decode("utf-8", errors="replace"))
        process.stdout.close()

    def first_unexpected_exit(self) -> Child | None:
        """The first child that has exited although nobody asked it to."""
        for child in self.children:
            if not child.expected_exit and child.process.poll() is not None:
                return child
        return None

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop every child, the last started first: SIGTERM, wait up to ``grace_s``, then SIGKILL."""
        running = [c for c in reversed(self.children) if c.process.poll() is None]
        for child in running:
            child.expected_exit = True
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

    @staticmethod
    def _signal(child: Child, sig: signal.Signals) -> None:
        try:
            os.killpg(child.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
