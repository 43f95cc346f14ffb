"""Domain events: how a lower app tells the apps above it that something happened, without importing them.

An app that records a state change (a reservation's event, a server's event, a join token's use) publishes the
recorded objects here under a ``kind``; an app above (notifications) subscribes in its ``AppConfig.ready()``.
Listeners run at once, inside the publisher's transaction, so what they write (an outbox row) commits or rolls
back with the change itself: an event is never announced for a change that did not happen, and never lost
between a commit and a message broker that is down. A listener must therefore be cheap and must not do I/O
beyond the database; anything slow belongs in a task it enqueues with ``transaction.on_commit``.

Kinds published today:

- ``reservation``: ``ReservationEvent`` objects (every state change, extension and note of a reservation);
- ``server``: ``ServerEvent`` objects from heartbeats and node-loss detection (GPU health, offline, back from
  offline); a node-loss pass publishes every server it marked offline in one call;
- ``node_loss_disruption``: a ``NodeLossDisruption`` that started or (``ended_at`` set) ended;
- ``join_token_used``: the ``JoinToken`` an agent enrolled with (its ``server`` set).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Listener = Callable[[str, Sequence[Any]], None]

_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    if listener not in _listeners:
        _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def publish(kind: str, objects: Sequence[Any]) -> None:
    """Hand ``objects`` (recorded, in the caller's transaction) to every listener; nothing to hand, no call."""
    if not objects:
        return
    for listener in list(_listeners):
        listener(kind, objects)
