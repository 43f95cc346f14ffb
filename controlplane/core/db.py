"""Transactions that the database aborted only to let another one through, run again.

PostgreSQL aborts one of two transactions that wait on each other (``deadlock_detected``, SQLSTATE 40P01)
and, under REPEATABLE READ or SERIALIZABLE, one whose reads a concurrent commit has made stale
(``serialization_failure``, 40001). Neither says anything about the request: the aborted work left nothing
behind and would succeed if it ran again, which is what the database asks for. Some deadlocks cannot be
prevented by taking locks in one order: an exclusion constraint's check runs after the row's index entry is
in, so two bookings that insert overlapping allocations of one GPU at the same instant each find the other's
entry and wait for it (PostgreSQL's src/backend/executor/execIndexing.c says as much).

``retry_on_transient`` is the atomic block of such a workflow, run again (a few times, after a short random
pause, so that the two parties do not collide again in step) when one of them aborts it:

- as the outermost block it is the whole transaction: both failures are retried;
- inside an outer transaction it is a savepoint. Rolling back to it releases every lock taken inside it, so a
  deadlock among those locks is broken and the block can run again; a serialization failure cannot be
  cured that way (the snapshot belongs to the outer transaction), so it goes up to the outer owner.

When the tries run out, the caller gets a Conflict (409, "try again"), as for any other writer that won.
SQLite has neither failure: its writers take the database lock one at a time.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import DatabaseError, connection, transaction

from controlplane.core.errors import Conflict

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

DEADLOCK_DETECTED = "40P01"
SERIALIZATION_FAILURE = "40001"
LOCK_NOT_AVAILABLE = "55P03"
ATTEMPTS = 5
# Full jitter on an exponential step: 0-40 ms, 0-80 ms, ... at most 0.5 s; PostgreSQL's deadlock_timeout
# (1 s) already separated the two parties once, and the pause keeps them from meeting at the same instant.
_BACKOFF_S = 0.02
_MAX_BACKOFF_S = 0.5


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error, looked for down the chain: Django wraps the driver's exception
    (psycopg's carries ``sqlstate``) as ``__cause__``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        state = getattr(current, "sqlstate", None)
        if isinstance(state, str):
            return state
        current = current.__cause__ or current.__context__
    return None


def _retryable(exc: DatabaseError, *, nested: bool) -> bool:
    state = sqlstate(exc)
    return state == DEADLOCK_DETECTED or (state == SERIALIZATION_FAILURE and not nested)


def retry_on_transient(fn: Callable[P, T]) -> Callable[P, T]:
    """``@transaction.atomic`` that runs ``fn`` again when the database aborted it to break a deadlock or a
    serialization conflict (see the module docstring). Use it in place of ``@transaction.atomic``."""
    atomic_fn = transaction.atomic(fn)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        nested = connection.in_atomic_block
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return atomic_fn(*args, **kwargs)
            except DatabaseError as exc:
                if not _retryable(exc, nested=nested):
                    raise
                if attempt == ATTEMPTS:
                    raise Conflict(
                        "Competing requests kept colliding in the database; try again.", code="conflict"
                    ) from exc
                log.info("%s: %s (try %d of %d), running it again", fn.__qualname__, exc, attempt, ATTEMPTS)
            time.sleep(random.uniform(0, min(_MAX_BACKOFF_S, _BACKOFF_S * 2**attempt)))
        raise AssertionError("unreachable")

    return wrapper
