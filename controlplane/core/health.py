"""What the probes answer (/livez, /readyz, /healthz in controlplane/fleet/urls.py).

Liveness checks nothing but that the process serves a request: a dependency that is down is no reason to
restart a web process, and restarting every replica while PostgreSQL restarts would only slow the recovery.

Readiness checks the database, the cache and the broker, each in a thread of its own and all at once, with one
deadline (``HEALTH_CHECK_TIMEOUT_S``): a dependency that has not answered by then is ``timeout``, so a probe
answers within the deadline whatever hangs. A check still running from an earlier probe is waited on again,
not started twice, so a hung dependency holds one thread per check, not one per probe.

Only the database is required: without it nothing is served (503). Without Redis the API still serves (the
cache fails open, controlplane/core/cache.py; bookings answer 201 and the agents' heartbeats open the windows),
so a cache or broker that is down makes the state ``degraded`` and the answer 200: taking every replica out of
the balancer because Redis is down would turn a delay into an outage.

Apps above may add **facts** to the body (``register_fact``): the fleet says whether node-loss handling is held
(``node_loss``: a grace after our own outage, or a disruption). A fact never changes the answer: a held
detector is the system protecting itself, not a reason to stop serving. Facts are read, once the database
answered, in the same pool and within the same deadline; one that fails or hangs is named as such.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections

from controlplane.core.cache import cache_check

REQUIRED = ("database",)


@dataclass(frozen=True)
class Check:
    state: str  # ok | down | timeout
    ms: float
    error: str | None = None

    def as_dict(self, *, required: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "required": required, "ms": round(self.ms, 1)}
        if self.error:
            out["error"] = self.error
        return out


def timeout_s() -> float:
    return float(getattr(settings, "HEALTH_CHECK_TIMEOUT_S", 2.0))


def database_check() -> None:
    connection = connections["default"]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        # This thread serves no request, so nothing else would ever close its connection.
        connection.close()


def broker_check() -> None:
    from controlplane.core.celeryapp import app

    conf = app.conf
    if conf.task_always_eager:
        return
    url = str(conf.broker_url or "")
    if url.startswith(("redis://", "rediss://")):
        import redis

        # The broker's own timeout, as publishes use it: a broker slower than that is down for them too.
        wait = min(float(getattr(settings, "REDIS_TIMEOUT_S", 1.0)), timeout_s())
        client = redis.Redis.from_url(url, socket_connect_timeout=wait, socket_timeout=wait)
        try:
            client.ping()
        finally:
            client.close()
        return
    if url.startswith("filesystem://"):
        options = conf.broker_transport_options or {}
        for key in ("data_folder_in", "data_folder_out"):
            folder = options.get(key)
            if folder and not os.access(folder, os.W_OK):
                raise OSError(f"the broker folder {folder} is not writable")
        return
    raise ValueError(f"no check for the broker transport {url.partition('://')[0]!r}")


Fact = Callable[[], dict[str, Any]]
_facts: dict[str, Fact] = {}


def register_fact(name: str, fact: Fact) -> None:
    """An app above core adds ``name`` to the readiness body (in its ``AppConfig.ready()``)."""
    _facts[name] = fact


def _read_fact(fact: Fact) -> dict[str, Any]:
    try:
        return fact()
    finally:
        # This thread serves no request, so nothing else would ever close its connection.
        connections["default"].close()


CHECKS: dict[str, Callable[[], None]] = {
    "database": database_check,
    "cache": cache_check,
    "broker": broker_check,
}


class _Runner:
    """Runs each check in a small pool; a check already in flight is shared, never started twice."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=2 * (len(CHECKS) + 1), thread_name_prefix="health")
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[Any]] = {}

    def run(self, names: tuple[str, ...]) -> dict[str, Check]:
        deadline = time.monotonic() + timeout_s()
        futures = {name: self._submit(name) for name in names}
        out: dict[str, Check] = {}
        for name, future in futures.items():
            try:
                out[name] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                out[name] = Check("timeout", timeout_s() * 1000, f"no answer within {timeout_s():g} s")
        return out

    def facts(self, deadline: float) -> dict[str, Any]:
        futures = {name: self._shared(f"fact:{name}", _read_fact, fact) for name, fact in _facts.items()}
        out: dict[str, Any] = {}
        for name, future in futures.items():
            try:
                out[name] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                out[name] = {"error": f"no answer within {timeout_s():g} s"}
            except Exception as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        return out

    def _submit(self, name: str) -> Future[Check]:
        return self._shared(name, _timed, CHECKS[name])

    def _shared(self, key: str, fn: Callable[..., Any], arg: Any) -> Future[Any]:
        with self._lock:
            future = self._inflight.get(key)
            if future is None or future.done():
                future = self._pool.submit(fn, arg)
                self._inflight[key] = future
            return future


def _timed(check: Callable[[], None]) -> Check:
    started = time.monotonic()
    try:
        check()
    except Exception as exc:
        return Check("down", (time.monotonic() - started) * 1000, f"{type(exc).__name__}: {exc}"[:200])
    return Check("ok", (time.monotonic() - started) * 1000)


_runner = _Runner()


def readiness() -> tuple[bool, dict[str, Any]]:
    """(ready, body): ready unless a required dependency is not ``ok``; body names every dependency."""
    deadline = time.monotonic() + timeout_s()
    checks = _runner.run(tuple(CHECKS))
    ready = all(checks[name].state == "ok" for name in REQUIRED)
    degraded = any(check.state != "ok" for check in checks.values())
    body: dict[str, Any] = {
        "status": "unavailable" if not ready else "degraded" if degraded else "ok",
        "checks": {name: check.as_dict(required=name in REQUIRED) for name, check in checks.items()},
    }
    if ready and _facts:
        body.update(_runner.facts(deadline))
    return ready, body
