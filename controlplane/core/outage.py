"""Knowing that a dependency is down, so that the next calls do not each wait to find out again.

A Redis that does not answer (frozen, or behind a partition) costs every call its socket timeout. After one
call failed, an ``Outage`` answers "skip" for ``retry_after_s``: callers go on without the dependency at once.
Then one caller, and only one at a time, tries again (the probe); its success ends the outage. One ``Outage``
per dependency and process, shared by all threads (controlplane/core/cache.py, controlplane/core/broker.py).

The log gets one warning when the dependency goes down, at most one line per ``log_every_s`` while it stays
down (with the number of calls that went without it meanwhile), and one when it is back: an outage is a
handful of lines, not one per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0


class Outage:
    def __init__(
        self,
        name: str,
        *,
        meanwhile: str,
        retry_after_s: float,
        log_every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.meanwhile = meanwhile  # what the callers do without it, for the log
        self.retry_after_s = retry_after_s
        self.log_every_s = log_every_s
        self.clock = clock
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self._retry_at = 0.0
        self._probing = False
        self._logged_at = 0.0
        self._since_log = 0
        self._in_outage = 0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def skip(self) -> bool:
        """True: go on without the dependency. False: call it; while down only one caller at a time gets
        False, once ``retry_after_s`` has passed since the last failure."""
        with self._lock:
            if self.down_since is None:
                return False
            if self._probing or self.clock() < self._retry_at:
                self._since_log += 1
                self._in_outage += 1
                return True
            self._probing = True
            return False

    def failed(self, operation: str, exc: BaseException) -> None:
        with self._lock:
            now = self.clock()
            self._probing = False
            self._retry_at = now + self.retry_after_s
            self._since_log += 1
            self._in_outage += 1
            error = f"{type(exc).__name__} on {operation}: {exc}"
            if self.down_since is None:
                self.down_since, self._logged_at, self._since_log = now, now, 0
                log.warning(
                    "%s unreachable (%s); %s; trying again every %g s",
                    self.name,
                    error,
                    self.meanwhile,
                    self.retry_after_s,
                )
            elif now - self._logged_at >= self.log_every_s:
                log.warning(
                    "%s still unreachable after %.0f s (%s); %d calls went without it since the last line",
                    self.name,
                    now - self.down_since,
                    error,
                    self._since_log,
                )
                self._logged_at, self._since_log = now, 0

    def succeeded(self) -> None:
        if self.down_since is None:  # the common case, without the lock
            return
        with self._lock:
            self._probing = False
            if self.down_since is None:
                return
            log.warning(
                "%s reachable again after %.1f s; %d calls went without it meanwhile",
                self.name,
                self.clock() - self.down_since,
                self._in_outage,
            )
            self.down_since = None
            self._in_outage = 0


_outages: dict[tuple[str, str], Outage] = {}
_outages_lock = threading.Lock()


def outage_for(kind: str, location: str, *, meanwhile: str, retry_after_s: float) -> Outage:
    """The process's one ``Outage`` for ``kind`` (cache, broker) at ``location`` (its URL)."""
    key = (kind, location)
    with _outages_lock:
        if key not in _outages:
            _outages[key] = Outage(f"{kind} {redact(location)}", meanwhile=meanwhile, retry_after_s=retry_after_s)
        return _outages[key]


def redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return scheme + sep + rest
