"""``gpucp logs``: a reservation's container output, as kept or followed live (Server-Sent Events).

Following reads ``GET /reservations/{id}/logs/?follow=1`` as a stream. The server ends each stream after a
while (each holds one of its threads) and whenever the connection breaks the CLI connects again with the
last event's id as ``?after=``, so nothing is printed twice or skipped, until the ``end`` event: every
container of the reservation has ended and all its output was sent.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import click
import requests

from gpucp.client import Api, _result, path
from gpucp.errors import Unreachable
from gpucp.output import emit_json
from gpucp.state import State, pass_state

# Consecutive failed connections before giving up, and the pause before each retry.
RECONNECTS = 5
RECONNECT_PAUSE_S = (0.5, 1.0, 2.0, 4.0, 8.0)
# The server sends a comment every 15 s: silence for longer means a dead connection.
READ_TIMEOUT_S = 45.0


@dataclass
class Event:
    id: str | None = None
    event: str = "message"
    data: list[str] = field(default_factory=list)


def _blocks(response: requests.Response) -> Iterator[bytes]:
    """Bytes as they arrive (``iter_content`` waits for a whole block, or the whole body without chunking)."""
    read1 = getattr(response.raw, "read1", None)
    if read1 is None:
        yield from response.iter_content(chunk_size=1)
        return
    while data := read1(65536):
        yield data


def parse_events(blocks: Iterator[bytes]) -> Iterator[Event]:
    """Server-Sent Events from a byte stream: comments and ``retry:`` skipped, multi-line data joined."""
    pending = b""
    event = Event()
    for block in blocks:
        pending += block
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").removesuffix("\r")
            if not line:
                if event.data:
                    yield event
                event = Event()
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                event.data.append(value)
            elif name == "id":
                event.id = value
            elif name == "event":
                event.event = value


class _Printer:
    """Text as it comes; a header when the output switches to another container; drops reported on stderr."""

    def __init__(self, *, json_lines: bool) -> None:
        self.json_lines = json_lines
        self.current: str | None = None

    def message(self, data: dict[str, Any], event_id: str | None) -> None:
        if self.json_lines:
            click.echo(json.dumps({"id": event_id, **data}, ensure_ascii=False))
            return
        if self.current is not None and data.get("launch_id") != self.current:
            click.echo(f"\n==> {data.get('server')} (generation {data.get('generation')}) <==")
        self.current = data.get("launch_id")
        if data.get("cut"):
            click.echo(f"gpucp: {data['cut']} bytes of {data.get('server')}'s output were dropped here", err=True)
        click.echo(data.get("text", ""), nl=False)

    def end(self, event_id: str | None) -> None:
        if self.json_lines:
            click.echo(json.dumps({"id": event_id, "event": "end"}))


def follow(api: Api, reservation_id: uuid.UUID, printer: _Printer, *, after: str | None = None) -> None:
    """Print the reservation's output as it comes, reconnecting with the cursor, until the ``end`` event."""
    url = api.server + path("reservations", reservation_id, "logs")
    failures = 0
    while True:
        params: dict[str, str] = {"follow": "1"}
        if after:
            params["after"] = after
        try:
            response = api.session.get(
                url,
                params=params,
                headers={"Accept": "text/event-stream"},
                stream=True,
                timeout=(min(api.timeout, 10.0), READ_TIMEOUT_S),
            )
        except requests.RequestException as exc:
            failures += 1
            if failures > RECONNECTS:
                raise Unreachable(f"Cannot reach {api.server} to follow the logs: {exc.__class__.__name__}") from exc
            time.sleep(RECONNECT_PAUSE_S[failures - 1])
            continue
        with response:
            if response.status_code != 200:
                if response.status_code in (502, 503, 504) and failures < RECONNECTS:
                    failures += 1
                    time.sleep(RECONNECT_PAUSE_S[failures - 1])
                    continue
                _result(response, api.server)  # raises the API's error, with its exit code
                raise Unreachable(f"{api.server} answered HTTP {response.status_code} to a follow.")
            began = time.monotonic()
            try:
                for event in parse_events(_blocks(response)):
                    failures = 0
                    if event.event == "end":
                        printer.end(event.id)
                        return
                    if event.event != "message":
                        continue
                    printer.message(json.loads("\n".join(event.data)), event.id)
                    after = event.id or after
            except (requests.RequestException, OSError, ValueError):
                pass  # a broken stream: connect again from the last event
        # The stream ended without the end event (the server's time limit, a proxy's): connect again. One that
        # ends at once, again and again, is a failure, not a reason to spin.
        if time.monotonic() - began < 1.0:
            failures += 1
            if failures > RECONNECTS:
                raise Unreachable(f"{api.server} keeps closing the log stream at once.")
            time.sleep(RECONNECT_PAUSE_S[failures - 1])


@click.command("logs")
@click.argument("reservation_id", metavar="ID", type=click.UUID)
@click.option("-f", "--follow", "following", is_flag=True, help="Follow the output as it comes, until all ended.")
@click.option("--json", "json_lines", is_flag=True, help="Print the API's answer (with -f: one event a line).")
@pass_state
def logs(state: State, reservation_id: uuid.UUID, following: bool, json_lines: bool) -> None:
    """Print a reservation's container output.

    What is kept of each container's output (the newest 1 MiB by default), or with -f everything from
    there on as it comes, until every container has ended.
    """
    json_lines = json_lines or state.json
    api = state.api()
    printer = _Printer(json_lines=json_lines)
    if following:
        follow(api, reservation_id, printer)
        return
    answer = api.get(path("reservations", reservation_id, "logs"))
    if json_lines:
        emit_json(answer)
        return
    launches = answer.get("launches", [])
    for entry in launches:
        if len(launches) > 1:
            click.echo(f"==> {entry['server']} (generation {entry['generation']}, {entry['state']}) <==")
        if entry.get("cut"):
            click.echo(f"gpucp: the first {entry['cut']} bytes of {entry['server']}'s output were dropped", err=True)
        for gap in entry.get("gaps", []):
            click.echo(
                f"gpucp: {gap['bytes']} bytes of {entry['server']}'s output are missing at byte {gap['offset']}",
                err=True,
            )
        text = entry.get("text", "")
        click.echo(text, nl=bool(text) and not text.endswith("\n"))
    if not launches:
        click.echo("gpucp: no container has run yet", err=True)
