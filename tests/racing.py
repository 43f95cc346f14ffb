"""Racing writers for the PostgreSQL race tests: each callable in its own thread and connection, released
together by a barrier."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def together(*works: Callable[[], Any], join_s: float = 120.0) -> list[Any]:
    """Run ``works`` at once; each one's result, or the exception it raised, in the order given."""
    barrier = threading.Barrier(len(works))
    results: list[Any] = [None] * len(works)

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = works[i]()
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(works))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_s)
    return results
