"""``gpucp logs``: what is kept, and ``-f`` following across the server's stream limit until the end event."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from typing import Any

import pytest
from click.testing import Result
from django.utils import timezone
from gpucp_support import Gpucp, World, token_of, user

from controlplane.dispatch import logs, services
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from nodeagent import schema
from tests.dispatch.logs_support import short_streams
from tests.dispatch.support import book


def launch_of(world: World) -> Launch:
    r = book(world.project, world.model, count=1, user=world.owner)
    services.dispatch_open_due()
    return Launch.objects.get(reservation=r)


def write(launch: Launch, offset: int, data: bytes, *, eof: bool = False) -> None:
    """As the agent's batch would: through the ingest service, on the launch's own server."""
    import base64

    chunk = schema.LogChunk(launch_id=launch.launch_id, offset=offset, data=base64.b64encode(data).decode(), eof=eof)
    logs.logs_ingest(server=launch.server, batch=schema.LogBatch(chunks=[chunk]), now=timezone.now())


def finish(launch: Launch) -> None:
    Launch.objects.filter(pk=launch.pk).update(state=LaunchState.EXITED, exit_code=0, finished_at=timezone.now())
    Reservation.objects.filter(pk=launch.reservation_id).update(state=ReservationState.COMPLETED)


def rid(launch: Launch) -> str:
    return str(launch.reservation.public_id)


def in_thread(gpucp: Gpucp, *args: str) -> tuple[threading.Thread, dict[str, Result]]:
    out: dict[str, Result] = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", gpucp(*args)), daemon=True)
    thread.start()
    return thread, out


def test_logs_prints_what_is_kept(gpucp: Gpucp, world: World) -> None:
    launch = launch_of(world)
    write(launch, 0, "epoch 1 loss=0.9\népoque 2\n".encode())
    result = gpucp("logs", rid(launch))
    assert result.exit_code == 0, result.output
    assert result.stdout == "epoch 1 loss=0.9\népoque 2\n"
    assert result.stderr == ""


def test_logs_says_on_stderr_where_output_was_dropped(gpucp: Gpucp, world: World, settings: Any) -> None:
    settings.DISPATCH_LOG_KEEP_BYTES = 1024
    launch = launch_of(world)
    write(launch, 0, b"x" * 1500)
    write(launch, 2000, b"tail\n")  # the agent lost 500 bytes
    result = gpucp("logs", rid(launch))
    assert result.exit_code == 0
    assert result.stdout == "x" * (1024 - 5) + "tail\n"
    assert "the first 481 bytes" in result.stderr and "500 bytes" in result.stderr and "byte 1500" in result.stderr


def test_logs_json_prints_the_apis_answer(gpucp: Gpucp, world: World) -> None:
    launch = launch_of(world)
    write(launch, 0, b"hello\n")
    result = gpucp("logs", "--json", rid(launch))
    body = json.loads(result.stdout)
    assert body["launches"][0]["text"] == "hello\n" and body["cursor"] == f"{launch.pk}-6"
    assert json.loads(gpucp("--json", "logs", rid(launch)).stdout) == body


@pytest.mark.slow
def test_logs_follow_prints_new_output_across_reconnects_until_the_end(
    gpucp: Gpucp, world: World, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    short_streams(settings, monkeypatch)
    settings.DISPATCH_LOG_FOLLOW_MAX_S = 1.0  # the CLI reconnects with its cursor every second
    launch = launch_of(world)
    write(launch, 0, b"line 0\n")
    thread, out = in_thread(gpucp, "logs", "-f", rid(launch))
    offset = 7
    for i in range(1, 6):
        time.sleep(0.6)
        data = f"line {i}\n".encode()
        write(launch, offset, data, eof=i == 5)
        offset += len(data)
    finish(launch)
    thread.join(timeout=15)
    result = out["result"]
    assert result.exit_code == 0, result.output
    assert result.stdout == "".join(f"line {i}\n" for i in range(6))  # every line once, through 3+ streams


@pytest.mark.slow
def test_logs_follow_json_prints_one_event_a_line_and_the_end(gpucp: Gpucp, world: World, settings: Any) -> None:
    launch = launch_of(world)
    write(launch, 0, b"a\n")
    write(launch, 2, b"b\n", eof=True)
    finish(launch)
    result = gpucp("--json", "logs", "-f", rid(launch))
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0]["text"] == "a\nb\n" and lines[0]["server"] == world.server.hostname
    assert lines[0]["id"] == f"{launch.pk}-4" and lines[0]["launch_id"] == launch.launch_id
    assert lines[-1] == {"id": f"{launch.pk}-4", "event": "end"}


def test_logs_of_another_tenant_or_no_such_reservation_is_exit_4(gpucp: Gpucp, world: World) -> None:
    launch = launch_of(world)
    write(launch, 0, b"secret\n")
    outsider = token_of(user())[1]
    for args in (("logs", rid(launch)), ("logs", "-f", rid(launch))):
        result = gpucp(*args, token=outsider)
        assert result.exit_code == 4, result.output
        assert "secret" not in result.output
    assert gpucp("logs", "-f", str(uuid.uuid4())).exit_code == 4


def test_logs_without_a_valid_token_is_exit_3(gpucp: Gpucp, world: World) -> None:
    launch = launch_of(world)
    assert gpucp("logs", rid(launch), token="gcp_0123456789ab_wrong").exit_code == 3
    assert gpucp("logs", "-f", rid(launch), token="gcp_0123456789ab_wrong").exit_code == 3


def test_logs_follow_against_an_unreachable_server_is_exit_5(
    gpucp: Gpucp, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucp import logs as cli_logs

    monkeypatch.setattr(cli_logs, "RECONNECT_PAUSE_S", (0.01,) * 5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    result = gpucp("logs", "-f", str(uuid.uuid4()), server=dead)
    assert result.exit_code == 5
    assert "Cannot reach" in result.stderr
