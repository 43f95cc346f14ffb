"""The gateway's decisions on their own: windows to the second, keys by their bytes, stopped launches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncssh

from nodeagent import schema
from nodeagent.gateway.sessions import warning_line
from nodeagent.gateway.table import AccessTable, key_blob

T0 = datetime(2026, 5, 1, 14, 0, tzinfo=UTC)


def a_key() -> tuple[str, bytes]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    line = " ".join(key.export_public_key("openssh").decode().split()[:2])
    return line, bytes(key.public_data)


def spec(launch: str, reservation: str, keys: list[str], start: datetime, end: datetime) -> schema.DesiredContainer:
    authorized = [
        schema.AuthorizedKey(user=f"u{i}", public_key=k, fingerprint=f"SHA256:{i}") for i, k in enumerate(keys)
    ]
    return schema.DesiredContainer(
        launch_id=launch, reservation=reservation, project="p", image="img", gpu_uuids=["GPU-0001"],
        window_start=start, window_end=end, ssh_keys=authorized,
    )  # fmt: skip


def test_the_window_admits_from_its_start_to_just_before_its_end():
    line, blob = a_key()
    table = AccessTable()
    table.update([spec("l1", "r1", [line], T0, T0 + timedelta(hours=1))], [])
    assert table.authorize("r1", blob, T0 - timedelta(seconds=1)).refusal == (
        "gpucp: reservation r1 has not started; its window opens at 2026-05-01 14:00 UTC"
    )
    assert table.authorize("r1", blob, T0).key is not None
    assert table.authorize("r1", blob, T0 + timedelta(minutes=59, seconds=59)).grant is not None
    assert table.authorize("r1", blob, T0 + timedelta(hours=1)).refusal == (
        "gpucp: reservation r1 has ended; its window closed at 2026-05-01 15:00 UTC"
    )


def test_a_key_is_matched_by_its_bytes_and_gives_its_owner():
    alice, alice_blob = a_key()
    _, other_blob = a_key()
    table = AccessTable()
    table.update([spec("l1", "r1", ["  " + alice + "  ", "not a key at all here"], T0, T0 + timedelta(hours=1))], [])
    decision = table.authorize("r1", alice_blob, T0)
    assert decision.key is not None and decision.key.user == "u0"  # the broken line did not spoil the good one
    assert "not authorized" in (table.authorize("r1", other_blob, T0).refusal or "")
    assert key_blob("ssh-ed25519 AAAAnotbase64!") is None


def test_a_stopped_launch_and_an_unknown_reservation_admit_nobody():
    line, blob = a_key()
    table = AccessTable()
    table.update([spec("l1", "r1", [line], T0, T0 + timedelta(hours=1))], ["l1"])
    assert table.authorize("r1", blob, T0).refusal == "gpucp: no reservation r1 runs on this server"
    assert table.authorize("l1", blob, T0).refusal == "gpucp: no reservation l1 runs on this server"
    # The name is the client's own choice: it comes back short and printable.
    hostile = "\x1b[2Jx" + "y" * 100
    refusal = table.admit(hostile, T0).refusal or ""
    assert refusal == "gpucp: no reservation " + repr(hostile[:64]) + " runs on this server"
    assert "\x1b" not in refusal


def test_of_two_launches_of_one_reservation_the_one_in_its_window_is_chosen():
    line, blob = a_key()
    table = AccessTable()
    earlier = spec("old", "r1", [line], T0 - timedelta(hours=2), T0 - timedelta(hours=1))
    now = spec("new", "r1", [line], T0 - timedelta(minutes=5), T0 + timedelta(hours=1))
    table.update([earlier, now], [])
    grant = table.authorize("r1", blob, T0).grant
    assert grant is not None and grant.launch_id == "new"


def test_the_warning_says_how_long_is_left_and_when():
    end = T0
    assert warning_line(end, end - timedelta(minutes=5)) == (
        "*** gpucp: this reservation ends in 5 minutes (at 14:00 UTC); save your work ***"
    )
    assert "ends in 1 minute " in warning_line(end, end - timedelta(seconds=70))
    assert "ends in 30 seconds" in warning_line(end, end - timedelta(seconds=30))
