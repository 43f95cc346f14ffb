"""A leader lease for the periodic work that must not run twice at once.

The control plane may run two or more Celery beats (one per host, docs/operations.md, "Periodic work with two
beats"), so every periodic task is sent once per beat and interval, and two workers may run two copies of it at
the same instant. Most periodic tasks are correct that way by construction (conditional updates, unique
constraints, row locks). The few whose correctness rests on one pass seeing the whole picture at once (the
node-loss detector judging the fleet, the scheduler's pass ordering the queue) run behind this lease: a
PostgreSQL session advisory lock on a key named after the task, tried once, never waited on. The copy that does
not get it returns at once, doing nothing: the holder is doing that very work now, and the next beat tick runs
it again anyway.

Why an advisory lock in PostgreSQL rather than a lock in Redis with an expiry:

- the work it guards is in PostgreSQL, and the system keeps serving while Redis is down (invariant 9): a Redis
  lock would stop the detector and the scheduler exactly then, or, failing open, let them run twice;
- PostgreSQL ends the lease with the connection: a worker killed mid-task (SIGKILL, host lost) frees it as soon
  as the server sees the connection drop, with no expiry to tune against the longest run, and a run that takes
  longer than any expiry never overlaps its successor.

A session lock, not a transaction one (``pg_try_advisory_xact_lock``): the guarded tasks run many short
transactions (one per server, per request), and some make HTTP calls between them; one transaction around the
whole run would hold row locks across those calls. Session locks ignore rollbacks, so the lock is released
explicitly when the run ends, whatever it raised. A pooler in transaction mode (PgBouncer's
``pool_mode=transaction``) would hand the session to another client between transactions, so workers connect to
PostgreSQL directly or through a session-mode pool (docs/operations.md).

SQLite is one host's database (the embedded defaults are for one machine: one beat): there the lease is always
granted.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

from django.db import DatabaseError, connection

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# The advisory locks' first key: this module's keys never meet another user's two-key locks (idempotency's
# "IDKY", or a one-key lock, which PostgreSQL keeps in a space of its own).
LOCK_CLASS = 0x4C454144  # "LEAD"


def lock_key(name: str) -> int:
    """The advisory lock's second key for a lease name: 32 bits of its hash (signed, as PostgreSQL's int4)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big", signed=True)


@contextmanager
def leader_lease(name: str) -> Iterator[bool]:
    """Whether this process holds the lease ``name`` for the block: tried once, never waited on. Held until the
    block ends (or the connection does, if the process dies first)."""
    if connection.vendor != "postgresql":
        yield True
        return
    key = lock_key(name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_CLASS, key])
        row = cursor.fetchone()
    held = bool(row and row[0])
    try:
        yield held
    finally:
        if held:
            _release(name, key)


def _release(name: str, key: int) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_CLASS, key])
    except DatabaseError:
        # The connection died under the run: PostgreSQL dropped the lock with it. Closed here so that the next
        # task on this process does not find the dead connection first.
        log.warning("the connection holding leader lease %r was lost; the lease went with it", name)
        connection.close()


def leader_only(*, skipped: T, name: str | None = None) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Run the decorated task body only while holding its leader lease (named after the function unless
    ``name`` is given); a copy that finds the lease taken returns ``skipped`` at once. Put it under
    ``@shared_task``, so that Celery names the task after the function as before."""

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        lease = name or f"{fn.__module__}.{fn.__qualname__}"

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            with leader_lease(lease) as held:
                if not held:
                    log.debug("leader lease %r is held elsewhere: this run is skipped", lease)
                    return skipped
                return fn(*args, **kwargs)

        # Which lease guards it, for the docs' table and its test (tests/core/test_leader_schedule.py).
        wrapper.leader_lease = lease  # type: ignore[attr-defined]
        return wrapper

    return decorate
