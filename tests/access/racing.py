"""Racing writers for the PostgreSQL race tests of this app."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connections

from controlplane.core.errors import DomainError


def race(*work: Callable[[], object], join_s: float = 60.0) -> list[str]:
    """Each callable in its own thread and connection, released together; the outcomes, sorted: "ok" or the
    refusal's code."""
    barrier = threading.Barrier(len(work))
    outcomes: list[str] = []

    def run(job: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=10)
            job()
            outcomes.append("ok")
        except DomainError as exc:
            outcomes.append(exc.code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(job,)) for job in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_s)
    return sorted(outcomes)
