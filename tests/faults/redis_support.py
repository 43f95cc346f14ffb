"""A private Redis for the outage tests: a redis-server of the test's own on a free port, stopped and started
again on the same port (an outage, then the same Redis back), or frozen with SIGSTOP (a Redis that accepts
connections and answers nothing, as behind a partition), with the Django cache and the Celery broker of this
process pointed at it. Workers are real `celery -A controlplane worker` processes, started as `runsystem`
starts them with Redis (thread pool, gossip, mingle and heartbeats on).

The redis-server and the workers are the dispatch tests' own (tests/dispatch/support.py); what is added here
is persistence (Redis keeps its data across the restart, as compose.yaml's does with ``--appendonly yes``),
the freeze, and the settings that make this process use it.
"""

from __future__ import annotations

import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.test import override_settings

from tests.conftest import service_missing
from tests.dispatch.support import CeleryWorker, PrivateRedis, celery_broker

T = TypeVar("T")

# The worker as runsystem starts it when REDIS_URL is set.
THREAD_WORKER_ARGS = ["worker", "--pool", "threads", "--concurrency", "4", "--loglevel", "INFO"]


class FaultRedis(PrivateRedis):
    """A PrivateRedis that keeps its data on disk across a stop and a start (``persist``), and can be frozen."""

    def __init__(self, tmp_path: Path, *, persist: bool = True) -> None:
        if shutil.which("redis-server") is None:
            service_missing("redis-server (for a private Redis to stop and start)")
        data = tmp_path / "redis-data"
        data.mkdir(exist_ok=True)
        args = ["--dir", str(data), "--appendonly", "yes", "--appendfsync", "always"] if persist else []
        super().__init__(log_path=tmp_path / "redis.log", args=args)
        self.frozen = False

    def freeze(self) -> None:
        """SIGSTOP: the kernel still accepts connections, nothing is ever answered."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.process is not None and self.frozen:
            self.process.send_signal(signal.SIGCONT)
        self.frozen = False

    def stop(self) -> None:
        self.thaw()  # a stopped process would not act on SIGTERM
        super().stop()


def transport_options(**extra: Any) -> dict[str, Any]:
    """The broker's transport options as settings make them for Redis, with the test's additions."""
    timeout = settings.REDIS_TIMEOUT_S
    return {"visibility_timeout": 3600, "socket_timeout": timeout, "socket_connect_timeout": timeout, **extra}


@contextmanager
def redis_backed(url: str, options: dict[str, Any] | None = None) -> Iterator[None]:
    """The cache and the broker of this process on ``url``, as settings make them when REDIS_URL is set."""
    timeout = settings.REDIS_TIMEOUT_S
    caches = {
        "default": {
            "BACKEND": "controlplane.core.cache.FailOpenRedisCache",
            "LOCATION": url,
            "OPTIONS": {"socket_connect_timeout": timeout, "socket_timeout": timeout},
        }
    }
    with override_settings(CACHES=caches), celery_broker(url, options or transport_options()):
        yield


def thread_worker(redis: PrivateRedis, tmp_path: Path, options: dict[str, Any]) -> CeleryWorker:
    name = f"faults-{uuid.uuid4().hex[:6]}"
    return CeleryWorker(
        broker_url=redis.url,
        transport_options=options,
        log_path=tmp_path / f"{name}.log",
        worker_args=[*THREAD_WORKER_ARGS, "--hostname", f"{name}@%h"],
    )


def timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started
