"""``ssh -L`` reaches the container's own loopback (it runs on ``network: none``); nothing else is forwarded."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request

import pytest

from .support import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.faults]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(port: int) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=2) as response:
            return bytes(response.read())
    except OSError:
        return None


@pytest.mark.parametrize("destination", ["localhost", "127.0.0.1"])
def test_a_local_forward_reaches_a_server_on_the_containers_loopback(world, destination):  # type: ignore[no-untyped-def]
    assert world.container("a").attrs["HostConfig"]["NetworkMode"] == "none"
    port = free_port()
    ssh = world.ssh.popen(world.keys["alice"], "res-a", "-N", "-o", "ExitOnForwardFailure=yes",
                          "-L", f"127.0.0.1:{port}:{destination}:8888", stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert wait_for(lambda: fetch(port), what="the page through the forward") == b"hello-from-container\n"
    finally:
        ssh.terminate()
        ssh.wait(timeout=10)
    closed = wait_for(lambda: [s for s in world.sessions("close") if "forward" in s.kinds], what="the close event")
    assert closed[-1].user == "alice"


def test_stdio_forwarding_to_the_container_works_too(world):  # type: ignore[no-untyped-def]
    result = world.ssh.ssh(world.keys["bob"], "res-a", "", "-W", "localhost:8888",
                           input=b"GET /index.html HTTP/1.0\r\n\r\n")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(b"hello-from-container\n")


@pytest.mark.parametrize("destination", ["10.1.2.3:80", "8.8.8.8:53", "172.17.0.1:2375", "example.com:80"])
def test_a_forward_to_anything_but_the_containers_loopback_is_refused(world, destination):  # type: ignore[no-untyped-def]
    result = world.ssh.ssh(world.keys["alice"], "res-a", "", "-W", destination, input=b"")
    err = result.stderr.decode()
    assert result.returncode == 255, err
    assert "administratively prohibited" in err and "only ports on the container's own localhost" in err


def test_a_forward_to_a_closed_port_says_nothing_listens(world):  # type: ignore[no-untyped-def]
    result = world.ssh.ssh(world.keys["alice"], "res-a", "", "-W", "localhost:9", input=b"")
    assert result.returncode == 255
    assert b"nothing accepts connections on 127.0.0.1:9 in the container" in result.stderr


def test_the_hosts_own_loopback_is_not_what_a_forward_reaches(world):  # type: ignore[no-untyped-def]
    # A listener on the host's 127.0.0.1: the container's loopback is another one, so the forward finds nothing.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = world.ssh.ssh(world.keys["alice"], "res-a", "", "-W", f"127.0.0.1:{port}", input=b"")
    assert result.returncode == 255
    assert b"nothing accepts connections" in result.stderr


def test_remote_forwards_agent_and_x11_forwarding_are_refused(world):  # type: ignore[no-untyped-def]
    remote = world.ssh.ssh(world.keys["alice"], "res-a", "", "-N", "-o", "ExitOnForwardFailure=yes",
                           "-R", f"127.0.0.1:{free_port()}:127.0.0.1:22")  # fmt: skip
    assert remote.returncode == 255
    assert b"remote port forwarding failed" in remote.stderr
    env = {**os.environ, "DISPLAY": "127.0.0.1:99"}
    extras = subprocess.run(
        [*world.ssh.popen_argv(world.keys["alice"], "res-a", "-A", "-X", "-o", "ForwardAgent=yes"),
         'echo "agent=[$SSH_AUTH_SOCK] display=[$DISPLAY]"'],
        capture_output=True, timeout=30, env=env, check=False,
    )  # fmt: skip
    assert extras.returncode == 0, extras.stderr
    assert extras.stdout == b"agent=[] display=[]\n"
    assert b"X11 forwarding request failed" in extras.stderr
