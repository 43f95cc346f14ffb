"""Signed commands from the control plane to one node's agent, and the agent's small HTTP listener for them.

A command carries the node's whole desired state, computed after the launch it announces was committed. The
heartbeat reply carries the same thing, so a command only makes a launch or a stop *faster*: losing one
costs at most one heartbeat.

Signing: HMAC-SHA256 over ``timestamp + "." + body``, keyed with the SHA-256 hex digest of the node's
credential. The control plane stores exactly that digest and the agent derives it from its plaintext
credential, so the key itself never crosses the wire. The signature binds the server name too (it is in
the signed body and compared with the agent's own name), so one node's key cannot drive another node.

The listener runs in its own thread and only verifies and queues; the agent loop applies what it takes from
the queue, so the runtime is only ever driven from one thread.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any

from pydantic import Field, ValidationError

from nodeagent import schema

log = logging.getLogger(__name__)

COMMAND_PATH = "/v1/commands"
HEADER_TIMESTAMP = "X-GPUCP-Timestamp"
HEADER_SIGNATURE = "X-GPUCP-Signature"
HEADER_SERVER = "X-GPUCP-Server"
MAX_AGE_S = 60.0
MAX_BODY_BYTES = 2_000_000


class NodeCommand(schema.Strict):
    """The desired state of one node, pushed. ``command_id`` makes a redelivery recognisable."""

    schema_version: schema.Literal[1] = schema.SCHEMA_VERSION  # type: ignore[valid-type]
    command_id: Annotated[str, Field(min_length=1, max_length=64)]
    server: schema.ShortText
    issued_at: datetime
    reason: Annotated[str, Field(max_length=200)] = ""
    desired: list[schema.DesiredContainer] = Field(default_factory=list)
    stop: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list)


def signing_key(credential: str) -> str:
    """The key both sides hold: the SHA-256 hex digest of the node credential (what the control plane stores)."""
    return hashlib.sha256(credential.encode()).hexdigest()


def signature(key: str, timestamp: str, body: bytes) -> str:
    return hmac.new(key.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def signed_request(*, key: str, command: NodeCommand, now: float | None = None) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a signed command, as the control plane sends it."""
    body = command.model_dump_json().encode()
    timestamp = f"{time.time() if now is None else now:.3f}"
    return body, {
        "Content-Type": "application/json",
        HEADER_TIMESTAMP: timestamp,
        HEADER_SIGNATURE: signature(key, timestamp, body),
        HEADER_SERVER: command.server,
    }


def new_command(
    *,
    server: str,
    desired: list[schema.DesiredContainer],
    stop: list[str],
    reason: str = "",
    now: datetime | None = None,
) -> NodeCommand:
    return NodeCommand(
        command_id=str(uuid.uuid4()),
        server=server,
        issued_at=now or datetime.now(UTC),
        reason=reason[:200],
        desired=desired,
        stop=stop,
    )


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class CommandVerifier:
    """Checks a command's signature, age and server before anything acts on it."""

    def __init__(
        self,
        *,
        credential: Callable[[], str | None],
        server_name: Callable[[], str | None],
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._credential = credential
        self._server_name = server_name
        self.max_age_s = max_age_s
        self.clock = clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def verify(self, headers: Any, body: bytes) -> tuple[NodeCommand, bool]:
        """The command and whether it was seen before; raises ``Refused`` (401/403/400) otherwise."""
        credential, ours = self._credential(), self._server_name()
        if not credential or not ours:
            raise Refused(503, "this agent has not enrolled or heard from the control plane yet")
        timestamp = headers.get(HEADER_TIMESTAMP) or ""
        given = headers.get(HEADER_SIGNATURE) or ""
        server = headers.get(HEADER_SERVER) or ""
        try:
            sent = float(timestamp)
        except ValueError:
            raise Refused(401, f"{HEADER_TIMESTAMP} is missing or not a number") from None
        now = self.clock()
        # A replayed capture is refused once it is older than the window; a clock far ahead is as suspect.
        if abs(now - sent) > self.max_age_s:
            raise Refused(401, f"{HEADER_TIMESTAMP} is more than {self.max_age_s:g} s away from this node's clock")
        if server.lower() != ours.lower():
            raise Refused(403, f"this command is for server {server!r}, and this node is {ours!r}")
        expected = signature(signing_key(credential), timestamp, body)
        if not hmac.compare_digest(expected, given):
            raise Refused(401, "the signature does not match this node's credential")
        try:
            command = NodeCommand.model_validate_json(body)
        except ValidationError as exc:
            raise Refused(400, f"the command is not valid: {exc.errors()[0].get('msg')}") from None
        if command.server.lower() != ours.lower():
            raise Refused(403, f"the signed command names server {command.server!r}")
        with self._lock:
            for command_id, at in list(self._seen.items()):
                if now - at > 2 * self.max_age_s:
                    del self._seen[command_id]
            duplicate = command.command_id in self._seen
            self._seen[command.command_id] = now
        return command, duplicate


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        if self.path.rstrip("/") != COMMAND_PATH:
            self._reply(404, {"error": f"unknown path {self.path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY_BYTES:
            self._reply(413 if length else 400, {"error": "the body is empty or too large"})
            return
        body = self.rfile.read(length)
        try:
            command, duplicate = self.server.channel.verifier.verify(self.headers, body)
        except Refused as exc:
            log.warning("refused a command from %s: %s", self.client_address[0], exc.message)
            self._reply(exc.status, {"error": exc.message})
            return
        if not duplicate:
            self.server.channel.put(command)
        self._reply(202, {"accepted": True, "duplicate": duplicate, "command_id": command.command_id})

    def do_GET(self) -> None:
        self._reply(405, {"error": "commands are POSTed"})

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("command listener: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    channel: CommandChannel


class CommandChannel:
    """The agent's end of pushed commands: a listener thread that verifies and queues, and the state the agent
    loop merges into each heartbeat reply.

    The race it closes: a heartbeat reply computed *before* a launch existed may arrive *after* that launch
    was pushed, and would stop the container just started. So a pushed launch is kept in the desired state
    until the reply to a heartbeat *sent after the push arrived* (that reply was computed after the launch
    was committed) is the authority again. The rule uses only the agent's own ordering, no clocks.
    """

    def __init__(
        self,
        *,
        credential: Callable[[], str | None],
        server_name: Callable[[], str | None],
        bind: tuple[str, int] = ("127.0.0.1", 0),
        advertise_host: str | None = None,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.verifier = CommandVerifier(
            credential=credential, server_name=server_name, max_age_s=max_age_s, clock=clock
        )
        self.bind = bind
        self.advertise_host = advertise_host
        self._queue: queue.SimpleQueue[NodeCommand] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        # launch_id -> (desired, heartbeat seq when the push arrived); same for stops.
        self._pushed: dict[str, tuple[schema.DesiredContainer, int]] = {}
        self._pushed_stop: dict[str, int] = {}

    # -- the listener ----------------------------------------------------------------------------------------

    def start(self) -> CommandChannel:
        httpd = _Server(self.bind, _Handler)
        httpd.channel = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="command-listener", daemon=True)
        self._thread.start()
        log.info("listening for control plane commands on %s", self.url)
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def url(self) -> str | None:
        if self._httpd is None:
            return None
        host, port = self._httpd.server_address[:2]
        host = self.advertise_host or str(host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}{COMMAND_PATH}"

    # -- between the listener thread and the loop ---------------------------------------------------------

    def put(self, command: NodeCommand) -> None:
        self._queue.put(command)
        self._wake.set()

    def take(self) -> list[NodeCommand]:
        self._wake.clear()
        out: list[NodeCommand] = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def wait(self, timeout: float) -> None:
        """Sleep until ``timeout`` passes or a command (or ``wake``) arrives."""
        self._wake.wait(timeout)

    def wake(self) -> None:
        self._wake.set()

    # -- merging ---------------------------------------------------------------------------------------------

    def remember(self, command: NodeCommand, *, seq: int) -> None:
        """Keep what ``command`` asks for until a reply to a heartbeat numbered above ``seq`` arrives."""
        for item in command.desired:
            self._pushed[item.launch_id] = (item, seq)
        for launch_id in command.stop:
            self._pushed_stop[launch_id] = seq
            self._pushed.pop(launch_id, None)

    def merge(
        self, desired: list[schema.DesiredContainer], stop: list[str], *, reply_seq: int | None
    ) -> tuple[list[schema.DesiredContainer], list[str]]:
        """``desired``/``stop`` of a reply (or the last one) with the pushes it may not know yet.

        ``reply_seq`` is the number of the heartbeat the reply answers; pushes that arrived before that
        heartbeat was sent are known to the reply and are forgotten here. None: no new reply, only merge.
        """
        if reply_seq is not None:
            self._pushed = {k: v for k, v in self._pushed.items() if v[1] >= reply_seq}
            self._pushed_stop = {k: s for k, s in self._pushed_stop.items() if s >= reply_seq}
        stops = list(dict.fromkeys([*stop, *self._pushed_stop]))
        stopping = set(stops)
        merged = {d.launch_id: d for d in desired if d.launch_id not in stopping}
        for launch_id, (item, _) in self._pushed.items():
            if launch_id not in stopping:
                merged.setdefault(launch_id, item)
        return list(merged.values()), stops


def next_due(desired: list[schema.DesiredContainer], now: datetime) -> datetime | None:
    """The next instant the runtime must act on its own, between heartbeats: a window opening, a warning,
    a window closing, or a kill after the grace."""
    moments: list[datetime] = []
    for d in desired:
        moments.extend(
            [
                d.window_start,
                d.window_end - timedelta(seconds=d.warn_before_s) if d.warn_before_s else d.window_end,
                d.window_end,
                d.window_end + timedelta(seconds=d.stop_grace_s),
            ]
        )
    future = [m for m in moments if m > now]
    return min(future) if future else None
