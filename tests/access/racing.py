"""Racing writers for the PostgreSQL race tests of this app."""

from __future__ import annotations

from collections.abc import Callable

from controlplane.core.errors import DomainError
from tests.racing import together


def race(*work: Callable[[], object], join_s: float = 60.0) -> list[str]:
    """Each callable in its own thread and connection, released together; the outcomes, sorted: "ok" or the
    refusal's code."""
    outcomes: list[str] = []
    for result in together(*work, join_s=join_s):
        if isinstance(result, DomainError):
            outcomes.append(result.code)
        elif isinstance(result, Exception):
            raise result
        else:
            outcomes.append("ok")
    return sorted(outcomes)
