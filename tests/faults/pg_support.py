"""PostgreSQL faults for the fault tests: backends terminated with ``pg_terminate_backend``, as a restart or a
failover drops them (the client sees ``AdminShutdown``), at a chosen step of a request served by the live
server.

The terminations go through a connection of their own, never the suite's, and never touch another database:
only backends of the test database are terminated, and the test's own connection is spared.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.dispatch.support import database_url


def backend_pid() -> int:
    """The PostgreSQL backend of this thread's Django connection (connecting it if needed)."""
    connection.ensure_connection()
    assert connection.connection is not None
    return int(connection.connection.info.backend_pid)


def _admin() -> psycopg.Connection[Any]:
    return psycopg.connect(database_url(), autocommit=True, connect_timeout=5)


def terminate(pid: int) -> None:
    """Terminate one backend and wait (up to 5 s) until it is gone."""
    with _admin() as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


def terminate_all(*, spare: int | None = None) -> int:
    """Terminate every backend of the test database but ``spare`` (and the one doing it): a restart, as the
    application's connections see it. Returns how many went."""
    with _admin() as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> %s",
            [spare or 0],
        ).fetchall()
    return len(rows)


def waits_on_lock(pid: int) -> bool:
    with _admin() as admin:
        row = admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return row is not None and row[0] == "Lock"


class Fault:
    """Terminates the backend of the thread that reaches a patched step, once, in any thread but the test's:
    the live server's handler thread, mid-request. ``before`` kills it as the step starts (the step's own
    statement meets the dead connection), otherwise right after the step returns."""

    def __init__(self) -> None:
        self.fired: list[str] = []
        self.victims: list[int] = []
        self._test_thread = threading.get_ident()
        self._lock = threading.Lock()

    def _take(self, step: str) -> bool:
        with self._lock:
            if self.fired or threading.get_ident() == self._test_thread:
                return False
            self.fired.append(step)
            return True

    def kill_self(self) -> None:
        pid = backend_pid()
        self.victims.append(pid)
        terminate(pid)

    def wrap(self, step: str, original: Callable[..., Any], *, before: bool) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            armed = self._take(step)
            if armed and before:
                self.kill_self()
            result = original(*args, **kwargs)
            if armed and not before:
                self.kill_self()
            return result

        return patched


@contextmanager
def fault_at(monkeypatch: pytest.MonkeyPatch, target: Any, name: str, *, before: bool = True) -> Iterator[Fault]:
    """While inside, the first call of ``target.name`` from another thread loses its database connection."""
    fault = Fault()
    with monkeypatch.context() as m:
        m.setattr(target, name, fault.wrap(name, getattr(target, name), before=before))
        yield fault


class Gate:
    """Holds the first call of a patched step (from another thread) until ``open()``: a request caught in the
    middle, its transaction open."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._open = threading.Event()
        self.pid: int | None = None
        self._test_thread = threading.get_ident()
        self._used = False

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            if not self._used and threading.get_ident() != self._test_thread:
                self._used = True
                self.pid = backend_pid()
                self.reached.set()
                assert self._open.wait(timeout=60)
            return original(*args, **kwargs)

        return patched

    def open(self) -> None:
        self._open.set()


def wait_until(predicate: Callable[[], Any], *, timeout: float = 15.0, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return value
