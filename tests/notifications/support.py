"""Real local servers for the notification tests: an SMTP server (aiosmtpd) and an HTTP receiver that checks
Standard Webhooks signatures the way a receiver would, and can fail its first deliveries on purpose."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controlplane.notifications import signing


@dataclass
class Received:
    msg_id: str
    timestamp: str
    signature: str
    body: bytes
    verified_with: list[str]

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Records every POST; answers 500 to the first ``fail_first`` of them, 200 after. ``secrets`` are what it
    verifies with (a receiver that knows only the new secret, or only the old one)."""

    secrets: list[str] = field(default_factory=list)
    fail_first: int = 0
    fail_numbers: set[int] = field(default_factory=set)  # these POSTs (1 = the first) fail too
    status_when_failing: int = 500
    received: list[Received] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hook"

    def verified(self) -> list[Received]:
        return [r for r in self.received if r.verified_with]

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                msg_id = self.headers.get("webhook-id", "")
                ts = self.headers.get("webhook-timestamp", "")
                sig = self.headers.get("webhook-signature", "")
                ok = [
                    s
                    for s in receiver.secrets
                    if signing.verify(s, msg_id=msg_id, timestamp=ts, signature=sig, body=body, now=time.time())
                ]
                with receiver.lock:
                    receiver.received.append(Received(msg_id, ts, sig, body, ok))
                    n = len(receiver.received)
                    failing = n <= receiver.fail_first or n in receiver.fail_numbers
                status = receiver.status_when_failing if failing else (200 if ok else 401)
                with receiver.lock:
                    receiver.answered.append(status)
                reply = b"nope" if status != 200 else b"ok"
                self.send_response(status)
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class SmtpSink:
    """A real SMTP server on 127.0.0.1 (aiosmtpd), keeping every message it accepts."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[Message] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        sink = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                sink.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
                sink.messages.append(message_from_bytes(envelope.content))
                return "250 OK"

        # aiosmtpd checks its server by connecting to the port it was given, so a port 0 will not do: a free one.
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=free)

    def start(self) -> SmtpSink:
        self.controller.start()
        return self

    @property
    def port(self) -> int:
        return int(self.controller.port)

    def stop(self) -> None:
        if getattr(self.controller, "_thread", None) is not None:
            self.controller.stop()
