"""Shells and commands through the gateway run inside the reservation's container, never on the host."""

from __future__ import annotations

import fcntl
import hashlib
import os
import pty
import select
import signal
import struct
import termios
import time
from pathlib import Path

import pytest

from .conftest import GPUS_A
from .support import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.faults]


def test_a_command_sees_exactly_the_launchs_gpus_and_its_exit_status_comes_back(world):  # type: ignore[no-untyped-def]
    result = world.ssh.ssh(world.keys["alice"], "res-a", 'echo "$NVIDIA_VISIBLE_DEVICES"; echo oops >&2; exit 7')
    assert result.returncode == 7, result.stderr
    assert result.stdout.decode().strip() == ",".join(GPUS_A)
    assert result.stderr.decode().strip() == "oops"  # stderr apart from stdout (Docker's frames undone)


def test_stdin_reaches_the_command_and_its_end_ends_the_command(world):  # type: ignore[no-untyped-def]
    payload = os.urandom(300_000)
    result = world.ssh.ssh(world.keys["bob"], "res-a", "cat > /tmp/from-stdin; wc -c < /tmp/from-stdin", input=payload)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(payload)
    inside = world.container("a").exec_run(["md5sum", "/tmp/from-stdin"]).output.decode().split()[0]
    assert inside == hashlib.md5(payload).hexdigest()  # noqa: S324 - a checksum, not security


def test_a_shell_runs_in_the_container_not_on_the_host(world):  # type: ignore[no-untyped-def]
    container = world.container("a")
    result = world.ssh.ssh(world.keys["alice"], "res-a", "cat /proc/1/cmdline; echo; hostname; echo $GPUCP_RESERVATION")
    assert result.returncode == 0, result.stderr
    cmdline, hostname, reservation = result.stdout.decode().split("\n")[:3]
    assert cmdline == "sleep\x003600\x00"  # the container's init, exec'd by its command
    assert cmdline.encode() != Path("/proc/1/cmdline").read_bytes()
    assert hostname == container.attrs["Config"]["Hostname"]
    assert reservation == "res-a"


def test_another_reservations_key_reaches_only_that_reservations_container(world):  # type: ignore[no-untyped-def]
    result = world.ssh.ssh(world.keys["carol"], "res-b", "echo $GPUCP_RESERVATION; hostname")
    assert result.returncode == 0, result.stderr
    reservation, hostname = result.stdout.decode().split()
    assert reservation == "res-b"
    assert (
        hostname == world.container("b").attrs["Config"]["Hostname"] != world.container("a").attrs["Config"]["Hostname"]
    )


def _read_until(master: int, buffer: bytearray, token: bytes, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while token not in buffer and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                buffer += os.read(master, 65536)
            except OSError:
                break
    return token in buffer


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_an_interactive_shell_gets_a_terminal_its_term_and_every_resize(world):  # type: ignore[no-untyped-def]
    master, slave = pty.openpty()
    _set_size(slave, 30, 100)
    env = {**os.environ, "TERM": "xterm-256color"}
    ssh = world.ssh.popen(
        world.keys["alice"], "res-a", "-tt", stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
    )
    os.close(slave)
    out = bytearray()
    try:
        os.write(master, b'echo "term=$TERM tty=$(tty)"; stty size\n')
        assert _read_until(master, out, b"30 100"), out.decode(errors="replace")
        assert b"term=xterm-256color tty=/dev/pts/" in out
        _set_size(master, 41, 123)
        ssh.send_signal(signal.SIGWINCH)
        time.sleep(0.3)
        os.write(master, b"stty size\n")
        assert _read_until(master, out, b"41 123"), out.decode(errors="replace")
        os.write(master, b"exit 5\n")
        assert ssh.wait(timeout=10) == 5
    finally:
        if ssh.poll() is None:
            ssh.kill()
        os.close(master)


def test_a_session_is_reported_at_open_and_at_close_with_who_from_where_and_what(world):  # type: ignore[no-untyped-def]
    before = len(world.events)
    result = world.ssh.ssh(world.keys["bob"], "res-a", "true")
    assert result.returncode == 0, result.stderr

    def this_session() -> list:  # type: ignore[type-arg]
        # This session's own: an earlier test's session may still be closing, its event landing after ``before``.
        later = [e for e in world.events[before:] if e.session is not None]
        opens = [e for e in later if e.session.phase == "open" and e.session.user == "bob"]
        if not opens:
            return []
        return [e for e in later if e.session.session_id == opens[0].session.session_id]

    wait_for(lambda: len(this_session()) >= 2, what="the open and close events")
    opened, closed = this_session()[:2]
    assert opened.kind == closed.kind == "session"
    assert opened.reservation == closed.reservation == "res-a"
    assert opened.session is not None and closed.session is not None
    assert opened.session.session_id == closed.session.session_id
    assert opened.session.phase == "open" and closed.session.phase == "close"
    assert opened.session.user == closed.session.user == "bob"
    assert opened.session.fingerprint == world.keys["bob"].fingerprint
    assert opened.session.source.startswith("127.0.0.1:")
    assert opened.session.ended_at is None and opened.session.reason == ""
    assert closed.session.kinds == ["exec"]
    assert closed.session.reason == "client disconnected"
    assert closed.session.ended_at is not None and closed.session.started_at == opened.session.started_at
    ids = [s.session_id for s in world.sessions("open")]
    assert len(ids) == len(set(ids))


def test_a_subsystem_other_than_sftp_is_refused(world):  # type: ignore[no-untyped-def]
    result = world.ssh.ssh(world.keys["alice"], "res-a", "netconf", "-s")
    assert result.returncode != 0
    assert b"no subsystem netconf" in result.stderr


def test_no_host_process_is_started_for_a_session(world):  # type: ignore[no-untyped-def]
    # The command exists only inside the container's view of /proc: a host shell would print the host's init.
    result = world.ssh.ssh(world.keys["alice"], "res-a", "readlink /proc/1/exe; ls /proc | grep -c '^[0-9]'")
    exe, count = result.stdout.decode().split()
    host_processes = sum(1 for name in os.listdir("/proc") if name.isdigit())
    assert exe == "/bin/busybox"
    assert int(count) < host_processes
