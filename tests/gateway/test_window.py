"""The window on open sessions: a warning on every terminal before the end, and the sessions closed at the end
or when the reservation is stopped; each close is reported with its reason."""

from __future__ import annotations

import subprocess
import threading
from datetime import timedelta

import pytest

from nodeagent.gateway.table import clock_time

from .conftest import make_spec
from .support import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.faults]


def window_specs(clock, keys):  # type: ignore[no-untyped-def]
    team = [keys["alice"].authorized("alice")]
    return {
        "w": make_spec("w", clock, ssh_keys=team, window_end=clock() + timedelta(minutes=10), warn_before_s=300),
        "s": make_spec("s", clock, ssh_keys=team),
    }


@pytest.fixture(scope="module")
def world(make_world):  # type: ignore[no-untyped-def]
    return make_world(window_specs, running=["w", "s"], key_names=("alice",))


class Reader:
    """Collects a stream in a thread, so the test can wait for a line while the session runs."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self.data = b""
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for chunk in iter(lambda: stream.read1(4096), b""):
            self.data += chunk


def open_session(world, reservation: str, *flags: str):  # type: ignore[no-untyped-def]
    ssh = world.ssh.popen(world.keys["alice"], reservation, *flags, command="echo ready; sleep 60",
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out, err = Reader(ssh.stdout), Reader(ssh.stderr)
    wait_for(lambda: b"ready" in out.data, what="the session to run")
    return ssh, out, err


def test_a_session_is_warned_before_the_end_and_closed_at_it(world):  # type: ignore[no-untyped-def]
    spec = world.specs["w"]
    end = spec.window_end
    ssh, out, err = open_session(world, "res-w", "-tt")
    try:
        world.clock.now = end - timedelta(seconds=301)
        world.gateway.update(list(world.specs.values()), [], world.clock())
        assert b"gpucp" not in out.data + err.data  # not yet
        world.clock.now = end - timedelta(seconds=299)  # the ticker sees it
        warning = f"*** gpucp: this reservation ends in 5 minutes (at {clock_time(end)}); save your work ***"
        wait_for(lambda: warning.encode() in out.data + err.data, what="the warning")
        assert ssh.poll() is None  # warned, still open
        world.clock.now = end
        assert ssh.wait(timeout=10) == 255
    finally:
        if ssh.poll() is None:
            ssh.kill()
    said = (out.data + err.data).decode()
    assert said.count("ends in 5 minutes") == 1
    assert f"*** gpucp: this reservation ended at {clock_time(end)}; closing this session ***" in said
    [closed] = [s for s in world.sessions("close") if s.kinds == ["exec"] and "window" in s.reason]
    assert closed.reason == f"the window ended at {end.strftime('%Y-%m-%d %H:%M')} UTC"
    # And nobody gets back in.
    again = world.ssh.ssh(world.keys["alice"], "res-w", "true")
    assert again.returncode == 255 and b"has ended" in again.stderr


def test_a_stopped_reservations_sessions_are_closed_at_once(world):  # type: ignore[no-untyped-def]
    ssh, _out, err = open_session(world, "res-s")
    try:
        others = [s for name, s in world.specs.items() if name != "s"]
        world.gateway.update(others, [], world.clock())  # cancelled: the control plane no longer lists it
        assert ssh.wait(timeout=10) == 255
    finally:
        if ssh.poll() is None:
            ssh.kill()
    assert "*** gpucp: this reservation was stopped; closing this session ***" in err.data.decode()
    closed = wait_for(lambda: [s for s in world.sessions("close") if s.reason == "the reservation was stopped"],
                      what="the close event")  # fmt: skip
    assert closed[0].user == "alice"
