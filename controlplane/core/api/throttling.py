"""The API's rate limits as two counters per caller, one Redis round trip per request.

DRF's own throttles keep every request's time of the last period in one cache entry: each request reads the
list, unpickles it, trims it, appends and writes it back, two round trips and work that grows with the rate
(at 6,000/min a busy caller's entry holds up to 6,000 floats). On the API's floor that was about a third of
what an authenticated GET cost.

These count instead: one counter per caller and fixed window of the rate's period, and the estimate of the
last period is the current window's count plus the previous window's, weighted by how much of it the last
period still covers (the sliding-window counter). Under an even rate the estimate is exact; a burst at a
window's end is counted in full until it starts to age out, never undercounted. A refused request is taken
back off the counter, so, as with DRF's, only served requests use up the rate.

The rates, their settings and the cache keys' names (``throttle_user_<id>``, ``throttle_anon_<ip>``) are
DRF's, so the classes read the same ``THROTTLE_RATES``. With the fail-open Redis cache
(controlplane/core/cache.py) a Redis that cannot be reached lets every request through.
"""

from __future__ import annotations

from typing import Any

from rest_framework import throttling


class WindowCounterMixin:
    """For a subclass of DRF's ``SimpleRateThrottle``: its ``allow_request`` and ``wait`` on counters."""

    cache: Any
    timer: Any
    rate: str | None
    num_requests: int
    duration: int

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)  # type: ignore[attr-defined]
        if key is None:
            return True
        now = self.timer()
        window = int(now // self.duration)
        current, previous = f"{window}:{key}", f"{window - 1}:{key}"
        count, before = count_in_window(self.cache, current, previous, timeout=2 * self.duration)
        self._covered = 1.0 - (now - window * self.duration) / self.duration  # of the previous window
        self._counts = (count, before)
        if before * self._covered + count <= self.num_requests:
            return True
        take_back(self.cache, current)
        self._counts = (count - 1, before)
        return False

    def wait(self) -> float | None:
        """Seconds until one more request would be served: until the previous window's weight has fallen
        far enough, or, when this window alone is full, until it ends."""
        count, before = self._counts
        left_in_window = self._covered * self.duration
        room = self.num_requests - 1 - count  # what the previous window's weighted count may be then
        if room < 0 or before == 0:
            return max(left_in_window, 1.0)
        # before * (covered - t / duration) <= room
        seconds = (self._covered - room / before) * self.duration
        return max(min(seconds, left_in_window), 1.0)


def count_in_window(cache: Any, current: str, previous: str, *, timeout: int) -> tuple[int, int]:
    """Add this request to ``current`` and read ``previous``: (current's count with it, previous's count)."""
    counter = getattr(cache, "count_in_window", None)
    if counter is not None:
        return counter(current, previous, timeout=timeout)  # type: ignore[no-any-return]
    # Any other cache (local memory in development and tests): the same counts, in its own calls.
    cache.add(current, 0, timeout)
    try:
        count = cache.incr(current)
    except ValueError:  # expired between the two calls
        cache.add(current, 1, timeout)
        count = 1
    return int(count), int(cache.get(previous) or 0)


def take_back(cache: Any, key: str) -> None:
    try:
        cache.decr(key)
    except ValueError:
        pass  # expired meanwhile: nothing left to take back


class AnonRateThrottle(WindowCounterMixin, throttling.AnonRateThrottle):
    """DRF's anonymous rate (``anon``), by client address, counted in windows."""


class UserRateThrottle(WindowCounterMixin, throttling.UserRateThrottle):
    """DRF's per-user rate (``user``; anonymous callers by address), counted in windows."""
