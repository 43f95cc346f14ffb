"""The cache fails open: with Redis unreachable every call is a miss, never an error, found out once per retry
interval; the API's throttles then let requests through. Redis is real here: the shared one for the normal
path, a closed port (stopped) or a silent server (frozen) for the faults."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings
from rest_framework.test import APIClient

from controlplane.core.broker import PUBLISH_ERRORS, BrokerUnavailable
from controlplane.core.cache import CACHE_ERRORS, FailOpenRedisCache
from controlplane.core.outage import Outage
from controlplane.core.tasks import prune_idempotency_records
from controlplane.dispatch.services import publish_once
from tests.core.sockets import SilentServer, closed_port
from tests.dispatch.support import celery_broker
from tests.factories import ApiTokenFactory

TIMEOUT_S = 0.3


def redis_cache(url: str) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "controlplane.core.cache.FailOpenRedisCache",
            "LOCATION": url,
            "OPTIONS": {"socket_connect_timeout": TIMEOUT_S, "socket_timeout": TIMEOUT_S},
        }
    }


@pytest.fixture
def stopped() -> Iterator[FailOpenRedisCache]:
    with override_settings(CACHES=redis_cache(f"redis://127.0.0.1:{closed_port()}/0")):
        yield caches["default"]  # type: ignore[misc]


def errors(operation: str) -> float:
    return CACHE_ERRORS.labels(operation)._value.get()


def test_cache_passes_through_to_a_live_redis(redis_url: str) -> None:
    with override_settings(CACHES=redis_cache(redis_url)):
        cache = caches["default"]
        cache.delete_many(["k", "n", "m1", "m2"])
        assert cache.add("k", {"a": 1}) is True and cache.add("k", 2) is False
        assert cache.get("k") == {"a": 1} and cache.has_key("k")
        cache.set("n", 1)
        assert cache.incr("n", 4) == 5
        assert cache.set_many({"m1": 1, "m2": 2}) == []
        assert cache.get_many(["m1", "m2", "nope"]) == {"m1": 1, "m2": 2}
        assert cache.touch("k", 60) is True and cache.delete("k") is True
        assert cache.get("k", "default") == "default"
        cache.delete_many(["n", "m1", "m2"])


def test_with_redis_stopped_every_call_is_a_miss_not_an_error(stopped: FailOpenRedisCache, caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane.core.outage")
    before = errors("get")
    assert stopped.get("k") is None and stopped.get("k", "fallback") == "fallback"
    stopped.set("k", 1)
    assert stopped.add("k", 1) is False
    assert stopped.get_many(["a", "b"]) == {}
    assert stopped.has_key("k") is False
    assert stopped.incr("counter", 3) == 3  # as if the counter were new
    assert stopped.set_many({"a": 1, "b": 2}) == ["a", "b"]  # Django's "keys not stored"
    assert stopped.delete("k") is False and stopped.touch("k") is False
    stopped.clear()
    stopped.delete_many(["a"])
    assert stopped.get_or_set("computed", lambda: 42) == 42
    assert errors("get") >= before + 3
    [line] = [r.getMessage() for r in caplog.records]  # one line for the outage, not one per call
    assert line.startswith("cache redis://127.0.0.1:") and "unreachable" in line and "failing open" in line


def test_a_frozen_redis_costs_one_timeout_per_retry_interval_not_one_per_call() -> None:
    with SilentServer() as silent, override_settings(CACHES=redis_cache(f"redis://127.0.0.1:{silent.port}/0")):
        cache = caches["default"]
        started = time.monotonic()
        assert cache.get("k", "miss") == "miss"
        first = time.monotonic() - started
        for _ in range(50):
            assert cache.get("k", "miss") == "miss"
    assert first >= TIMEOUT_S * 0.8, first  # the first call did wait for the frozen server
    assert silent.connections == 1  # known down: the other 50 were not asked within the retry interval


def test_an_outage_skips_until_the_retry_interval_then_one_call_probes_and_ends_it(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane.core.outage")
    now = [100.0]
    outage = Outage("cache test", meanwhile="failing open", retry_after_s=5.0, log_every_s=60.0, clock=lambda: now[0])
    assert outage.skip() is False  # up: every caller asks
    outage.failed("get", ConnectionError("refused"))
    assert outage.down and outage.skip() is True
    now[0] += 5.0
    assert outage.skip() is False  # the probe
    assert outage.skip() is True  # one probe at a time
    outage.failed("get", ConnectionError("still refused"))  # the probe failed: another interval
    assert outage.skip() is True
    now[0] += 61.0
    assert outage.skip() is False
    outage.failed("get", ConnectionError("still refused"))  # past log_every_s: a summary line
    assert outage.skip() is True
    now[0] += 5.0
    assert outage.skip() is False
    outage.succeeded()
    assert not outage.down and outage.skip() is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "unreachable (ConnectionError on get: refused)" in lines[0]
    assert "still unreachable after 66 s" in lines[1]
    assert lines[2].startswith("cache test reachable again after 71.0 s")


def test_throttles_fail_open_without_redis_and_count_again_with_it(
    db: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rest_framework.throttling import SimpleRateThrottle

    # DRF reads the rates from settings once, at import: a low rate for this test only.
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "2/min", "anon": "2/min"})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory().plaintext}")
    with override_settings(CACHES=redis_cache(f"redis://127.0.0.1:{closed_port()}/0")):
        assert [client.get("/api/v1/me/").status_code for _ in range(4)] == [200] * 4
    with override_settings(CACHES=redis_cache(redis_url)):
        caches["default"].clear()
        try:
            assert [client.get("/api/v1/me/").status_code for _ in range(3)] == [200, 200, 429]
        finally:
            caches["default"].clear()


def test_publishes_to_a_frozen_broker_wait_once_then_fail_at_once() -> None:
    with SilentServer() as silent:
        url = f"redis://127.0.0.1:{silent.port}/0"
        options = {"socket_timeout": TIMEOUT_S, "socket_connect_timeout": TIMEOUT_S}
        before = PUBLISH_ERRORS._value.get()
        with celery_broker(url, options):
            started = time.monotonic()
            with pytest.raises(Exception) as first:
                publish_once(prune_idempotency_records)
            first_s = time.monotonic() - started
            # Known down: these are refused by the guard itself, without asking the frozen server.
            for _ in range(5):
                with pytest.raises(BrokerUnavailable):
                    publish_once(prune_idempotency_records)
    assert not isinstance(first.value, BrokerUnavailable)
    assert first_s >= TIMEOUT_S * 0.8, first_s
    assert PUBLISH_ERRORS._value.get() == before + 6
