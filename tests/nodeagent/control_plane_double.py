"""A real HTTP server on 127.0.0.1 playing the control plane's agent endpoints, scripted per test.

It speaks the wire schema (requests are validated with ``nodeagent.schema``, so a malformed heartbeat fails
the test) and can be told to fail the next N requests with a status, or to refuse connections altogether.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from nodeagent import schema


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ControlPlaneDouble:
    credential: str = "node-credential-0123456789"
    heartbeat_interval_s: float = 5.0
    desired: list[dict[str, Any]] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    mig: list[dict[str, Any]] = field(default_factory=list)  # DesiredMig requests the reply carries
    prepull: list[dict[str, Any]] = field(default_factory=list)  # PrePulls, for an agent that says it pulls
    # The lease the reply gives an agent that says it fences; None plays a control plane without fencing.
    lease_s: float | None = None
    # The outage tolerance the reply tells an agent that says it understands one; None plays an older control plane.
    outage_tolerance_s: float | None = None
    # Seconds every request waits before it is answered: a control plane (or a network) that does not answer.
    hang_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    accepted: list[dict[str, Any]] = field(default_factory=list)  # heartbeats answered 200
    script: deque[tuple[int, Any]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if double.hang_s:
                    time.sleep(double.hang_s)
                double.received.append(Received(self.path, dict(self.headers), body))
                status, reply = double.answer(self.path, self.headers, body)
                if status == 200 and self.path.endswith("/heartbeat"):
                    double.accepted.append(body)
                data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail(self, times: int, status: int = 503, body: Any = None) -> None:
        for _ in range(times):
            self.script.append(
                (
                    status,
                    body
                    if body is not None
                    else {"error": {"code": "unavailable", "message": "the control plane is restarting", "fields": {}}},
                )
            )

    def answer(self, path: str, headers: Any, body: dict[str, Any]) -> tuple[int, Any]:
        if self.script:
            return self.script.popleft()
        if path == "/api/v1/agent/enroll":
            schema.EnrollRequest.model_validate(body)
            return 201, {
                "schema_version": 1,
                "server": body["hostname"],
                "credential": self.credential,
                "heartbeat_interval_s": self.heartbeat_interval_s,
            }
        if path == "/api/v1/agent/heartbeat":
            if headers.get("Authorization") != f"Bearer {self.credential}":
                return 401, {"error": {"code": "not_authenticated", "message": "unknown credential", "fields": {}}}
            schema.Heartbeat.model_validate(body)
            reply = {
                "schema_version": 1,
                "server": body["node"]["hostname"],
                "server_state": "ready",
                "heartbeat_interval_s": self.heartbeat_interval_s,
                "desired": self.desired,
                "stop": self.stop,
            }
            if self.mig:
                reply["mig"] = self.mig
            if self.prepull and body["node"].get("pulls"):
                reply["prepull"] = self.prepull
            if self.lease_s is not None and body["node"].get("fencing"):
                reply["lease_s"] = self.lease_s
            if self.outage_tolerance_s is not None and body["node"].get("outage_tolerant"):
                reply["outage_tolerance_s"] = self.outage_tolerance_s
            return 200, reply
        return 404, {"error": {"code": "not_found", "message": "no such endpoint", "fields": {}}}

    def accepted_samples(self) -> list[tuple[str, float]]:
        return [(s["uuid"], s["ts"]) for hb in self.accepted for s in samples_of(hb)]

    def accepted_events(self) -> list[dict[str, Any]]:
        return [e for hb in self.accepted for e in hb["events"]]


class FakeClock:
    """Wall time and monotonic time that move only when a test says so."""

    def __init__(self, start: datetime = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)) -> None:
        self._now = start
        self._mono = 1000.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._mono += seconds


def samples_of(heartbeat: dict[str, Any]) -> list[dict[str, Any]]:
    """A version 2 heartbeat's series back as one ``{uuid, ts, fields}`` per sample, in the order sent."""
    out = []
    for series in heartbeat["samples"]:
        for i, ts in enumerate(series["ts"]):
            fields = {name: values[i] for name, values in series["fields"].items()}
            out.append({"uuid": series["uuid"], "ts": ts, "fields": fields})
    return out
