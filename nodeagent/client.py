"""Talking to the control plane: enrollment, heartbeats, backoff, and the buffer that outlives an outage.

Failure rules:
- unreachable, timeout, 5xx, or a reply that fails the schema: retry later with exponential backoff, jitter
  and a cap; samples and events stay in a bounded buffer (oldest dropped first, drops counted and reported);
- 401: the node's credential was revoked; the agent stops and says what to do;
- 413: the payload was too large; the next heartbeat sends half as many samples;
- any other 4xx: the payload would never succeed, so it is logged and dropped.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from pydantic import BaseModel, ValidationError

import nodeagent
from nodeagent import schema

log = logging.getLogger(__name__)

ENROLL_PATH = "/api/v1/agent/enroll"
HEARTBEAT_PATH = "/api/v1/agent/heartbeat"
LOGS_PATH = "/api/v1/agent/logs/"

Reply = TypeVar("Reply", bound=BaseModel)


class ControlPlaneError(Exception):
    """Base of what the client raises."""


class Unreachable(ControlPlaneError):
    """Worth retrying: network error, timeout, 5xx, or a reply that does not parse."""


class Rejected(ControlPlaneError):
    """A 4xx: this payload will never succeed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class CredentialRevoked(Rejected):
    """401 on a heartbeat: the control plane no longer knows this node's credential."""


def _error_message(response: requests.Response) -> str:
    """The sentence from the control plane's error shape, or the start of whatever it sent."""
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return str(body["error"].get("message") or body["error"])
        if isinstance(body, dict) and "detail" in body:
            return str(body["detail"])
    except ValueError:
        pass
    return (response.text or response.reason or "").strip()[:300]


class ControlPlaneClient:
    """HTTP to the control plane. ``session`` is injectable; every reply is validated with ``nodeagent.schema``."""

    def __init__(self, server: str, *, session: requests.Session | None = None, timeout: float = 10.0) -> None:
        if not server.startswith(("http://", "https://")):
            raise ValueError(f"control plane URL {server!r} must start with http:// or https://")
        self.server = server.rstrip("/")
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = f"nodeagent/{nodeagent.__version__}"
        self.timeout = timeout

    def enroll(self, request: schema.EnrollRequest) -> schema.EnrollReply:
        return self._post(ENROLL_PATH, request, schema.EnrollReply, headers={})

    def heartbeat(
        self, credential: str, heartbeat: schema.Heartbeat, *, timeout: float | tuple[float, float] | None = None
    ) -> schema.HeartbeatReply:
        """``timeout`` (requests' connect and read timeouts) replaces the client's own for this request."""
        return self._post(
            HEARTBEAT_PATH,
            heartbeat,
            schema.HeartbeatReply,
            headers={"Authorization": f"Bearer {credential}"},
            revocable=True,
            timeout=timeout,
        )

    def post_logs(
        self, credential: str, batch: schema.LogBatch, *, timeout: float | tuple[float, float] | None = None
    ) -> schema.LogBatchReply:
        """Container log chunks (see ``nodeagent.logship``); raises as ``heartbeat`` does."""
        return self._post(
            LOGS_PATH,
            batch,
            schema.LogBatchReply,
            headers={"Authorization": f"Bearer {credential}"},
            revocable=True,
            timeout=timeout,
        )

    def _post(
        self,
        path: str,
        body: BaseModel,
        reply: type[Reply],
        *,
        headers: dict[str, str],
        revocable: bool = False,
        timeout: float | tuple[float, float] | None = None,
    ) -> Reply:
        url = self.server + path
        try:
            response = self.session.post(
                url,
                data=body.model_dump_json(),
                timeout=self.timeout if timeout is None else timeout,
                headers={"Content-Type": "application/json", **headers},
            )
        except requests.RequestException as exc:
            raise Unreachable(f"{url}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise Unreachable(f"{url}: HTTP {response.status_code}: {_error_message(response)}")
        if response.status_code == 401 and revocable:
            raise CredentialRevoked(401, _error_message(response))
        if response.status_code >= 400:
            raise Rejected(response.status_code, _error_message(response))
        try:
            return reply.model_validate(response.json())
        except (ValueError, ValidationError) as exc:
            # A control plane mid-upgrade may answer in a newer schema; retrying is right, dropping data is not.
            raise Unreachable(f"{url}: the reply is not a valid {reply.__name__}: {exc}") from exc


class Backoff:
    """Exponential backoff with a cap; each delay is jittered into [delay/2, delay] so agents spread out."""

    def __init__(
        self, *, base_s: float = 1.0, cap_s: float = 60.0, factor: float = 2.0, rng: Callable[[], float] = random.random
    ) -> None:
        self.base_s, self.cap_s, self.factor, self.rng = base_s, cap_s, factor, rng
        self.failures = 0

    def failure(self) -> float:
        """Record a failure; the seconds to wait before the next try."""
        self.failures += 1
        delay = min(self.cap_s, self.base_s * self.factor ** (self.failures - 1))
        return delay / 2 + self.rng() * delay / 2

    def reset(self) -> None:
        self.failures = 0


@dataclass
class Batch:
    samples: list[schema.GpuSample]
    events: list[schema.AgentEvent]
    buffered_events: int = 0  # how many of ``events`` came from the buffer (the rest is the drop report)


class TelemetryBuffer:
    """Samples and events waiting to be sent; bounded, so an outage costs the oldest data and never memory.

    ``take`` hands out the oldest items without removing them; ``commit`` removes them once the control plane
    has them (or once they are known never to be accepted). The agent is single-threaded and appends nothing
    between the two, so the items taken are still the oldest ones at commit.
    """

    def __init__(self, *, max_samples: int = schema.MAX_SAMPLES, max_events: int = schema.MAX_EVENTS - 1) -> None:
        self.samples: deque[schema.GpuSample] = deque(maxlen=max_samples)
        # One place in a heartbeat stays free for the event that reports drops.
        self.events: deque[schema.AgentEvent] = deque(maxlen=min(max_events, schema.MAX_EVENTS - 1))
        self.dropped_samples = 0
        self.dropped_events = 0
        self._unreported_samples = 0
        self._unreported_events = 0

    def add_samples(self, samples: list[schema.GpuSample]) -> None:
        for sample in samples:
            if len(self.samples) == self.samples.maxlen:
                self.dropped_samples += 1
                self._unreported_samples += 1
            self.samples.append(sample)

    def add_events(self, events: list[schema.AgentEvent]) -> None:
        for event in events:
            if len(self.events) == self.events.maxlen:
                self.dropped_events += 1
                self._unreported_events += 1
            self.events.append(event)

    def take(self, *, max_samples: int, now: Any) -> Batch:
        samples = [self.samples[i] for i in range(min(max_samples, len(self.samples)))]
        events = list(self.events)
        buffered_events = len(events)
        if self._unreported_samples or self._unreported_events:
            events.append(
                schema.AgentEvent(
                    kind="agent",
                    ts=now,
                    message=(
                        f"telemetry buffer full while the control plane was unreachable: dropped the oldest "
                        f"{self._unreported_samples} samples and {self._unreported_events} events"
                    ),
                )
            )
        return Batch(samples=samples, events=events, buffered_events=buffered_events)

    def commit(self, batch: Batch) -> None:
        for _ in range(len(batch.samples)):
            self.samples.popleft()
        for _ in range(min(batch.buffered_events, len(self.events))):
            self.events.popleft()
        if len(batch.events) > batch.buffered_events:  # the drop report went out
            self._unreported_samples = 0
            self._unreported_events = 0
