"""One SSH connection of a tenant, from login to close: who, which container, what it did, and the events
and terminal lines the gateway sends about it."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import asyncssh

from nodeagent import schema
from nodeagent.gateway.container import Target
from nodeagent.gateway.table import clock_time

Kind = Literal["shell", "exec", "sftp", "forward"]


def new_session_id() -> str:
    return f"ssh-{uuid.uuid4().hex}"


def warning_line(window_end: datetime, now: datetime) -> str:
    left = max(0.0, (window_end - now).total_seconds())
    if left >= 90:
        span = f"{round(left / 60)} minutes"
    elif left >= 60:
        span = "1 minute"
    else:
        span = f"{max(1, int(left))} seconds"
    return f"*** gpucp: this reservation ends in {span} (at {clock_time(window_end)}); save your work ***"


def ended_line(window_end: datetime) -> str:
    return f"*** gpucp: this reservation ended at {clock_time(window_end)}; closing this session ***"


STOPPED_LINE = "*** gpucp: this reservation was stopped; closing this session ***"
GATEWAY_STOPPED_LINE = "*** gpucp: the node agent is stopping; closing this session ***"


@dataclass(eq=False)
class Session:
    """An authenticated connection. Only the gateway's event loop reads or changes it."""

    session_id: str
    reservation: str
    launch_id: str
    user: str
    fingerprint: str
    source: str
    started_at: datetime
    target: Target
    conn: asyncssh.SSHServerConnection
    kinds: list[Kind] = field(default_factory=list)
    # The shells and commands running now, for the lines the gateway writes on their terminals.
    processes: set[asyncssh.SSHServerProcess[bytes]] = field(default_factory=set)
    warned_for: datetime | None = None
    close_reason: str | None = None
    closed: bool = False

    def used(self, kind: Kind) -> None:
        if kind not in self.kinds:
            self.kinds.append(kind)

    def tell(self, line: str) -> None:
        """A line on every terminal of this session (stderr, so no command's output is corrupted)."""
        for process in list(self.processes):
            eol = "\r\n" if process.term_type else "\n"
            with contextlib.suppress(Exception):  # a channel closing under us: nothing left to tell
                process.stderr.write(f"{eol}{line}{eol}".encode())

    def event(self, phase: schema.SessionPhase, now: datetime) -> schema.AgentEvent:
        info = schema.SessionInfo(
            session_id=self.session_id,
            phase=phase,
            user=self.user[:256],
            fingerprint=self.fingerprint[:256],
            source=self.source[:256],
            started_at=self.started_at,
            ended_at=now if phase == "close" else None,
            kinds=list(self.kinds),
            reason=(self.close_reason or "")[:500] if phase == "close" else "",
        )
        if phase == "open":
            message = f"ssh session {self.session_id} opened by {self.user} ({self.fingerprint}) from {self.source}"
        else:
            message = f"ssh session {self.session_id} of {self.user} closed: {self.close_reason or 'closed'}"
        return schema.AgentEvent(
            kind="session", ts=now, reservation=self.reservation[:64], session=info, message=message[:2000]
        )


def peer(conn: Any) -> str:
    peername = conn.get_extra_info("peername") or ("?", 0)
    host, port = peername[0], peername[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
