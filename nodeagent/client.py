"""Talking to the control plane: enrollment, heartbeats and backoff.

Failure rules:
- unreachable, timeout, 5xx, or a reply that fails the schema: retry later with exponential backoff, jitter
  and a cap; samples, events and container reports stay in the agent's journal (``nodeagent.journal``: on disk,
  bounded, the oldest samples dropped first, drops counted and reported);
- 401: the node's credential was revoked; the agent stops and says what to do;
- 413: the payload was too large; the next heartbeat sends half as many samples;
- any other 4xx: the payload would never succeed, so it is logged and dropped.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TypeVar

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
        except ValidationError as exc:
            # A control plane mid-upgrade may answer in a newer schema; retrying is right, dropping data is not.
            # Said without the input: a reply carries secrets and registry credentials (pydantic's own text
            # quotes what it refused), so neither this message nor its cause holds a value.
            raise Unreachable(f"{url}: the reply is not a valid {reply.__name__}: {validation_problems(exc)}") from None
        except ValueError as exc:
            raise Unreachable(f"{url}: the reply is not JSON: {exc.__class__.__name__}") from None


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


def validation_problems(exc: ValidationError, *, limit: int = 5) -> str:
    """Where a document broke the schema and why, never what it held there."""
    problems = [
        f"{'.'.join(str(part) for part in error.get('loc', ())) or '(the document)'}: {error.get('msg')}"
        for error in exc.errors(include_input=False, include_url=False)
    ]
    more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more
