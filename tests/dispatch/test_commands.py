"""The agent's command listener: it acts only on commands signed for its own node, fresh, and once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import requests

from nodeagent import commands, schema

CREDENTIAL = "gcn_0123456789ab_secret-of-node-a"
OTHER_CREDENTIAL = "gcn_ba9876543210_secret-of-node-b"


@pytest.fixture
def channel() -> Iterator[commands.CommandChannel]:
    ch = commands.CommandChannel(credential=lambda: CREDENTIAL, server_name=lambda: "node-a").start()
    yield ch
    ch.close()


def desired(launch_id: str = "L1") -> schema.DesiredContainer:
    start = datetime.now(UTC)
    return schema.DesiredContainer(
        launch_id=launch_id,
        reservation="r1",
        project="p",
        image="img",
        gpu_uuids=["GPU-a"],
        window_start=start,
        window_end=start + timedelta(minutes=1),
    )


def post(
    channel: commands.CommandChannel,
    *,
    key: str,
    server: str = "node-a",
    now: float | None = None,
    body_server: str | None = None,
) -> requests.Response:
    command = commands.new_command(server=body_server or server, desired=[desired()], stop=[])
    body, headers = commands.signed_request(key=key, command=command, now=now)
    headers[commands.HEADER_SERVER] = server
    assert channel.url
    return requests.post(channel.url, data=body, headers=headers, timeout=5)


def test_a_command_signed_with_this_nodes_credential_is_queued(channel):
    response = post(channel, key=commands.signing_key(CREDENTIAL))
    assert response.status_code == 202
    [command] = channel.take()
    assert command.desired[0].launch_id == "L1"


def test_another_nodes_signature_is_refused_and_never_acted_on(channel):
    response = post(channel, key=commands.signing_key(OTHER_CREDENTIAL))
    assert response.status_code == 401
    assert "signature" in response.json()["error"]
    assert channel.take() == []


def test_a_command_for_another_server_is_refused(channel):
    response = post(channel, key=commands.signing_key(OTHER_CREDENTIAL), server="node-b")
    assert response.status_code == 403
    # Even signed with our key, a body naming another server is refused.
    response = post(channel, key=commands.signing_key(CREDENTIAL), body_server="node-b", server="node-a")
    assert response.status_code == 403
    assert channel.take() == []


def test_a_stale_command_is_refused(channel):
    response = post(channel, key=commands.signing_key(CREDENTIAL), now=time.time() - 61)
    assert response.status_code == 401
    assert channel.take() == []


def test_a_tampered_body_is_refused(channel):
    command = commands.new_command(server="node-a", desired=[desired()], stop=[])
    body, headers = commands.signed_request(key=commands.signing_key(CREDENTIAL), command=command)
    assert channel.url
    response = requests.post(channel.url, data=body.replace(b"GPU-a", b"GPU-b"), headers=headers, timeout=5)
    assert response.status_code == 401


def test_a_redelivered_command_is_acknowledged_but_queued_once(channel):
    command = commands.new_command(server="node-a", desired=[desired()], stop=[])
    body, headers = commands.signed_request(key=commands.signing_key(CREDENTIAL), command=command)
    assert channel.url
    first = requests.post(channel.url, data=body, headers=headers, timeout=5)
    second = requests.post(channel.url, data=body, headers=headers, timeout=5)
    assert (first.status_code, second.status_code) == (202, 202)
    assert second.json()["duplicate"] is True
    assert len(channel.take()) == 1


def test_a_pushed_launch_survives_a_reply_computed_before_it_existed():
    ch = commands.CommandChannel(credential=lambda: CREDENTIAL, server_name=lambda: "node-a")
    pushed = commands.new_command(server="node-a", desired=[desired("L1")], stop=[])
    ch.remember(pushed, seq=7)  # heartbeat 7 was in flight when the push arrived
    merged, stop = ch.merge([], [], reply_seq=7)  # its reply predates the launch
    assert [d.launch_id for d in merged] == ["L1"] and stop == []
    merged, stop = ch.merge([], [], reply_seq=8)  # a reply to a heartbeat sent after the push is the authority
    assert merged == [] and stop == []


def test_a_pushed_stop_wins_over_a_stale_reply():
    ch = commands.CommandChannel(credential=lambda: CREDENTIAL, server_name=lambda: "node-a")
    ch.remember(commands.new_command(server="node-a", desired=[], stop=["L1"]), seq=3)
    merged, stop = ch.merge([desired("L1")], [], reply_seq=3)
    assert merged == [] and stop == ["L1"]


def test_next_due_is_the_next_start_warning_end_or_kill():
    now = datetime.now(UTC)
    item = desired().model_copy(
        update={
            "window_start": now + timedelta(seconds=1),
            "window_end": now + timedelta(seconds=10),
            "warn_before_s": 3,
            "stop_grace_s": 2,
        }
    )
    assert commands.next_due([item], now) == now + timedelta(seconds=1)
    assert commands.next_due([item], now + timedelta(seconds=2)) == now + timedelta(seconds=7)
    assert commands.next_due([item], now + timedelta(seconds=11)) == now + timedelta(seconds=12)
    assert commands.next_due([item], now + timedelta(seconds=13)) is None
