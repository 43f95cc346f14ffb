"""Who may reach which container: the gateway's table of reservations, keys and windows, and its refusals.

The agent hands the gateway every desired state it converges to (``AccessTable.update``); a login is decided
against the table as it stands at that moment, never against anything the client says beyond its user name
(the reservation id) and its public key. The refusals are sentences the tenant reads in their terminal (sent
as SSH auth banners), so they say what to do, and they never name anything of another reservation.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncssh

from nodeagent import schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grant:
    """One launch of a reservation on this node and the keys that may log in to it."""

    launch_id: str
    reservation: str
    window_start: datetime
    window_end: datetime
    warn_before_s: int
    # The key's SSH wire encoding (the base64 blob, decoded) -> whose key it is.
    keys: dict[bytes, schema.AuthorizedKey] = field(default_factory=dict, compare=False, repr=False)

    def is_open(self, now: datetime) -> bool:
        return self.window_start <= now < self.window_end


@dataclass(frozen=True)
class Decision:
    """A login's outcome: the grant and key it matched, or the sentence that says why not."""

    grant: Grant | None = None
    key: schema.AuthorizedKey | None = None
    refusal: str | None = None


def when(ts: datetime) -> str:
    """A window edge as a tenant reads it: ``2026-05-01 14:00 UTC``."""
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def clock_time(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%H:%M UTC")


def shown(name: str) -> str:
    """A user name as a banner may repeat it: the client chose it, so it is cut short and kept printable."""
    return name if name.isprintable() and len(name) <= 64 else repr(name[:64])


def no_reservation(reservation: str) -> str:
    return f"gpucp: no reservation {shown(reservation)} runs on this server"


def not_started(reservation: str, start: datetime) -> str:
    return f"gpucp: reservation {reservation} has not started; its window opens at {when(start)}"


def ended(reservation: str, end: datetime) -> str:
    return f"gpucp: reservation {reservation} has ended; its window closed at {when(end)}"


def key_refused(reservation: str) -> str:
    return (
        f"gpucp: this key is not authorized for reservation {reservation} "
        "(the keys of its project's owners and members are)"
    )


def not_running(reservation: str) -> str:
    return (
        f"gpucp: the container of reservation {reservation} is not running on this server "
        "(it may still be starting; try again in a moment)"
    )


@functools.lru_cache(maxsize=8192)
def key_blob(public_key: str) -> bytes | None:
    """The SSH wire encoding of an OpenSSH public key line; None for a line that is not a key."""
    try:
        return bytes(asyncssh.import_public_key(public_key).public_data)
    except (asyncssh.KeyImportError, ValueError, TypeError):
        return None


class AccessTable:
    """Reservation id -> its grants on this node. ``update`` is called from the agent's thread, the lookups
    from the gateway's; the table is replaced whole under a lock, so a lookup sees one desired state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grants: dict[str, tuple[Grant, ...]] = {}

    def update(self, desired: Iterable[schema.DesiredContainer], stop: Iterable[str]) -> None:
        stopped = set(stop)
        table: dict[str, list[Grant]] = {}
        for spec in desired:
            if spec.launch_id in stopped:
                continue
            keys: dict[bytes, schema.AuthorizedKey] = {}
            for authorized in spec.ssh_keys:
                blob = key_blob(authorized.public_key.strip())
                if blob is None:
                    log.warning(
                        "reservation %s: ignoring an SSH key of %s that is not an OpenSSH public key (%s)",
                        spec.reservation,
                        authorized.user,
                        authorized.fingerprint,
                    )
                    continue
                keys.setdefault(blob, authorized)
            grant = Grant(
                launch_id=spec.launch_id,
                reservation=spec.reservation,
                window_start=spec.window_start,
                window_end=spec.window_end,
                warn_before_s=spec.warn_before_s,
                keys=keys,
            )
            table.setdefault(spec.reservation, []).append(grant)
        with self._lock:
            self._grants = {reservation: tuple(grants) for reservation, grants in table.items()}

    def grants(self, reservation: str) -> tuple[Grant, ...]:
        with self._lock:
            return self._grants.get(reservation, ())

    def current(self, reservation: str, launch_id: str) -> Grant | None:
        """The grant a session was opened under as the table holds it now (its window may have moved)."""
        return next((g for g in self.grants(reservation) if g.launch_id == launch_id), None)

    def admit(self, reservation: str, now: datetime) -> Decision:
        """Whether anyone could log in as ``reservation`` now: the grant whose window is open, or why not."""
        grants = self.grants(reservation)
        if not grants:
            return Decision(refusal=no_reservation(reservation))
        for grant in grants:
            if grant.is_open(now):
                return Decision(grant=grant)
        upcoming = [g.window_start for g in grants if now < g.window_start]
        if upcoming:
            return Decision(refusal=not_started(reservation, min(upcoming)))
        return Decision(refusal=ended(reservation, max(g.window_end for g in grants)))

    def authorize(self, reservation: str, key_data: bytes, now: datetime) -> Decision:
        """Whether ``key_data`` (a key's SSH wire encoding) may log in as ``reservation`` now."""
        admitted = self.admit(reservation, now)
        if admitted.grant is None:
            return admitted
        key = admitted.grant.keys.get(bytes(key_data))
        if key is None:
            return Decision(refusal=key_refused(reservation))
        return Decision(grant=admitted.grant, key=key)
