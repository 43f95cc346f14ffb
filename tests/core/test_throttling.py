"""The API's throttles count requests in windows (controlplane/core/api/throttling.py): on real Redis through the
fail-open cache and on the local-memory cache, with the previous window weighted by how much of it the last
period still covers, refused requests taken back off the count, and DRF's rates and key names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.throttling import SimpleRateThrottle

from controlplane.core.api.throttling import UserRateThrottle
from tests.core.test_cache import redis_cache
from tests.factories import ApiTokenFactory

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "throttling"}}


@pytest.fixture(params=["redis", "locmem"])
def cache_settings(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    settings = redis_cache(request.getfixturevalue("redis_url")) if request.param == "redis" else LOCMEM
    with override_settings(CACHES=settings):
        caches["default"].clear()
        try:
            yield settings
        finally:
            caches["default"].clear()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def throttle(clock: Clock, rate: str = "3/min") -> UserRateThrottle:
    class Throttle(UserRateThrottle):
        THROTTLE_RATES = {"user": rate}
        timer = clock

    made = Throttle()
    made.cache = caches["default"]
    return made


def anonymous_request() -> Any:
    request = APIRequestFactory().get("/api/v1/me/", REMOTE_ADDR="198.51.100.7")
    request.user = None
    return request


def allowed(clock: Clock, times: int) -> list[bool]:
    return [throttle(clock).allow_request(anonymous_request(), None) for _ in range(times)]


def test_a_window_serves_its_rate_then_refuses(cache_settings: Any) -> None:
    clock = Clock(600 * 60 + 1.0)
    assert allowed(clock, 4) == [True, True, True, False]


def test_a_refused_request_does_not_use_up_the_rate(cache_settings: Any) -> None:
    clock = Clock(600 * 60 + 1.0)
    assert allowed(clock, 3) == [True] * 3
    assert allowed(clock, 5) == [False] * 5
    # Next window, a quarter of the last period still covering the previous one: 3 x 0.25 = 0.75 counted, so two
    # more fit. Had the five refusals counted, none would.
    clock.now = 601 * 60 + 45.0
    assert allowed(clock, 3) == [True, True, False]


def test_the_previous_window_ages_out_by_how_much_of_the_period_it_still_covers(cache_settings: Any) -> None:
    clock = Clock(600 * 60 + 59.0)
    assert allowed(clock, 3) == [True] * 3  # a burst at the end of a window
    clock.now = 601 * 60 + 1.0  # 2 s later: the burst is still almost wholly within the last minute
    assert allowed(clock, 1) == [False]
    clock.now = 601 * 60 + 40.0  # a third of the last minute is in the previous window: 1 counted, 2 fit
    assert allowed(clock, 3) == [True, True, False]
    clock.now = 603 * 60 + 1.0  # two windows on: nothing of it counts
    assert allowed(clock, 4) == [True, True, True, False]


def test_wait_says_when_the_next_request_is_served(cache_settings: Any) -> None:
    clock = Clock(600 * 60 + 30.0)
    assert allowed(clock, 3) == [True] * 3
    refused = throttle(clock)
    assert refused.allow_request(anonymous_request(), None) is False
    wait = refused.wait()
    assert wait == pytest.approx(30.0)  # this window alone is full: until it ends
    clock.now += wait - 0.5
    assert allowed(clock, 1) == [False]
    clock.now += 1.0
    nxt = throttle(clock)
    # The previous window's 3 weigh 3 x ~0.99: still over; once they weigh at most 2, one more is served.
    assert nxt.allow_request(anonymous_request(), None) is False
    clock.now += nxt.wait() + 0.01  # type: ignore[operator]
    assert allowed(clock, 1) == [True]


def test_the_api_throttles_a_user_by_the_rate_and_keeps_drf_key_names(
    db: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "2/min", "anon": "2/min"})
    token = ApiTokenFactory()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.plaintext}")
    with override_settings(CACHES=redis_cache(redis_url)):
        cache = caches["default"]
        cache.clear()
        try:
            statuses = [client.get("/api/v1/me/").status_code for _ in range(3)]
            keys = list(cache._cache.get_client().scan_iter(match="*"))  # type: ignore[attr-defined]
            response = client.get("/api/v1/me/")
        finally:
            cache.clear()
    assert statuses == [200, 200, 429]
    assert response.status_code == 429 and int(response["Retry-After"]) >= 1
    assert keys and all(key.decode().endswith(f"throttle_user_{token.user.pk}") for key in keys)
