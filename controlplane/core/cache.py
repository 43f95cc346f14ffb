"""The Django cache on Redis, failing open.

Nothing the control plane keeps in the cache is a source of truth: DRF's throttles keep their request
history there, and that is all. So when Redis cannot be reached a cache call answers as a miss (``get``
gives the default, ``add``/``set`` store nothing) instead of raising, the throttles let the request through,
and a Redis outage costs no API call anything but its rate limit (docs/operations.md, "Health checks").

Once a call fails the cache counts as down: for ``RETRY_AFTER_S`` every call answers at once without touching
the network, so a host that does not answer (a partition: each call would wait for the socket timeout)
costs one request one timeout, not every request one per cache call. Then one call tries Redis again.

Every call answered without Redis counts in ``gpucp_cache_errors_total{operation}``, per process; the log
gets a handful of lines per outage (controlplane/core/outage.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from prometheus_client import Counter
from redis.exceptions import RedisError

from controlplane.core.outage import outage_for

T = TypeVar("T")

# Registered in /metrics' registry by controlplane.fleet.metrics (core imports no app).
CACHE_ERRORS = Counter(
    "gpucp_cache_errors",
    "Cache operations answered without the cache (Redis raised, or was known down and skipped); "
    "the caller got a miss. Per process.",
    ["operation"],
    registry=None,
)

OPERATIONS = ("add", "get", "set", "touch", "delete", "get_many", "has_key", "incr", "set_many", "delete_many", "clear")
for _operation in OPERATIONS:  # every series exists from the start, at 0, so rate() and alerts see them
    CACHE_ERRORS.labels(_operation)

# Long enough that a dead host costs one timeout per few seconds, short enough that the throttles are back
# within seconds of Redis.
RETRY_AFTER_S = 5.0


class ReusedClientRedisCacheClient(RedisCacheClient):
    """Django's Redis cache client, keeping one ``redis.Redis`` per connection pool. Django builds a new one
    for every cache call, and building one (its table of ~170 reply callbacks) cost as much as the call's
    round trip to Redis. A client is safe to share between threads: each command takes a connection from
    the pool."""

    def __init__(self, servers: list[str], **options: Any) -> None:
        super().__init__(servers, **options)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        django: Any = self  # the stubs know none of Django's private helpers used here
        index = django._get_connection_pool_index(write)
        client = self._clients.get(index)
        if client is None:
            client = self._clients[index] = django._client(connection_pool=django._get_connection_pool(write))
        return client


class FailOpenRedisCache(RedisCache):
    """Django's Redis cache, with every operation failing open (see the module's docstring). Set the socket
    timeouts in OPTIONS (``socket_connect_timeout``, ``socket_timeout``): they bound what the first call of
    an outage waits."""

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = ReusedClientRedisCacheClient
        self.outage = outage_for(
            "cache",
            server if isinstance(server, str) else ",".join(server),
            meanwhile="failing open: cache calls answer as misses and the throttles let requests through",
            retry_after_s=RETRY_AFTER_S,
        )

    def _guard(self, operation: str, default: T, call: Callable[[], T]) -> T:
        if self.outage.skip():
            CACHE_ERRORS.labels(operation).inc()
            return default
        try:
            result = call()
        except RedisError as exc:
            self.outage.failed(operation, exc)
            CACHE_ERRORS.labels(operation).inc()
            return default
        self.outage.succeeded()
        return result

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return self._guard("add", False, partial(super().add, key, value, timeout, version))

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return self._guard("get", default, partial(super().get, key, default, version))

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        self._guard("set", None, partial(super().set, key, value, timeout, version))

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return self._guard("touch", False, partial(super().touch, key, timeout, version))

    def delete(self, key: Any, version: int | None = None) -> bool:
        return self._guard("delete", False, partial(super().delete, key, version))

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        keys = list(keys)
        return self._guard("get_many", {}, partial(super().get_many, keys, version))

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return self._guard("has_key", False, partial(super().has_key, key, version))

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        # Failing open, a counter reads as if it had just been created: the caller sees ``delta``.
        return self._guard("incr", delta, partial(super().incr, key, delta, version))

    def set_many(self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> list[Any]:
        return self._guard("set_many", list(data), partial(super().set_many, data, timeout, version))

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        keys = list(keys)
        self._guard("delete_many", None, partial(super().delete_many, keys, version))

    def clear(self) -> None:
        self._guard("clear", None, super().clear)

    def count_in_window(self, current: Any, previous: Any, *, timeout: int) -> tuple[int, int]:
        """For the API's throttles (controlplane/core/api/throttling.py): add one to the counter ``current``
        (made with ``timeout`` if new) and read the counter ``previous``, in one round trip. Failing open,
        the request is the first of its window."""

        def call() -> tuple[int, int]:
            pipe = self._cache.get_client(write=True).pipeline(transaction=False)
            key = self.make_and_validate_key(current)
            pipe.incr(key)
            pipe.expire(key, timeout)
            pipe.get(self.make_and_validate_key(previous))
            count, _, before = pipe.execute()
            return int(count), int(before or 0)

        return self._guard("incr", (1, 0), call)


def cache_check(alias: str = "default") -> None:
    """For the health checks: asks Redis itself, past the outage state, and raises when it does not answer.
    A local-memory cache is always there."""
    backend = caches[alias]
    if isinstance(backend, RedisCache):
        backend._cache.get_client(write=True).ping()
