"""Publishing to a broker that may be down.

Every task the control plane queues from a request or a heartbeat has a backstop that does not need the broker
(the beat's reconcilers, the agents' heartbeats), so a publish that fails is logged and dropped by its caller.
What this module adds is that a broker that does not answer is found out once, not once per publish: a
heartbeat that opens eight windows would otherwise wait eight socket timeouts. After a failure, publishes
fail at once for ``RETRY_AFTER_S`` (controlplane/core/outage.py), then one tries again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kombu.exceptions import OperationalError
from prometheus_client import Counter
from redis.exceptions import RedisError

from controlplane.core.outage import outage_for

# Registered in /metrics' registry by controlplane.fleet.metrics (core imports no app).
PUBLISH_ERRORS = Counter(
    "gpucp_broker_publish_errors",
    "Tasks that could not be queued (the broker raised, or was known down and not asked). Per process.",
    registry=None,
)

# What a broker that is down or cut off raises (kombu wraps most of it in OperationalError); anything else, a
# message that does not serialize for one, is the caller's bug and says nothing about the broker.
CONNECTION_ERRORS = (OperationalError, RedisError, OSError)

# Short: a skipped publish is a push that waits for the next heartbeat, so the broker is asked again soon.
RETRY_AFTER_S = 1.0


class BrokerUnavailable(ConnectionError):
    """The broker failed moments ago; this publish was not tried."""


@contextmanager
def broker_guard(url: str) -> Iterator[None]:
    """Wrap one publish to the broker at ``url``: raises ``BrokerUnavailable`` at once while it is known down,
    and records whether the publish reached it. Exceptions of the publish propagate."""
    outage = outage_for(
        "broker",
        url,
        meanwhile="tasks are not queued; the beat and the agents' heartbeats do their work",
        retry_after_s=RETRY_AFTER_S,
    )
    if outage.skip():
        PUBLISH_ERRORS.inc()
        raise BrokerUnavailable(f"the broker failed less than {RETRY_AFTER_S:g} s ago; not asked")
    try:
        yield
    except CONNECTION_ERRORS as exc:
        outage.failed("publish", exc)
        PUBLISH_ERRORS.inc()
        raise
    outage.succeeded()
