"""The log shipper on the real Docker engine against the live control plane: lines reach a follower quickly,
a restarted shipper resends nothing the control plane has, and an outage costs only what overflows the buffer.

Between the shipper and the live server sits ``Switch``, a TCP forwarder that can be cut (the control plane
down: connections refused) and restored on the same port, and that counts the bytes the shipper sent.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.dispatch.models import Launch, LaunchLog, LaunchLogChunk
from nodeagent.client import ControlPlaneClient
from nodeagent.journal import Journal
from nodeagent.logship import LogShipper
from nodeagent.runtime.containers import LABEL_LAUNCH, LABEL_NODE
from tests.dispatch.logs_support import Follower, running_launch, short_streams
from tests.factories import ApiTokenFactory, UserFactory

from .support import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.faults]


class Switch:
    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.sent = 0  # bytes from the shipper to the control plane
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.port = 0
        self.up()
        self.url = f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def down(self) -> None:
        if self._listener is not None:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close alone would not
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(65536):
                if counted:
                    self.sent += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def plane(
    transactional_db: None, live_server: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    short_streams(settings, monkeypatch)
    owner = UserFactory()
    launch, credential = running_launch(owner=owner)
    switch = Switch(live_server.url)
    yield {"launch": launch, "credential": credential, "switch": switch, "owner": owner, "url": live_server.url}
    switch.down()


@pytest.fixture
def ship(plane: dict[str, Any], docker_client: Any, node: str) -> Iterator[Callable[..., LogShipper]]:
    shippers: list[LogShipper] = []

    def start(**kwargs: Any) -> LogShipper:
        kwargs.setdefault("scan_interval_s", 0.2)
        shipper = LogShipper(
            client=ControlPlaneClient(plane["switch"].url),
            credential=lambda: plane["credential"],
            docker_client=docker_client,
            node=node,
            **kwargs,
        ).start()
        shippers.append(shipper)
        return shipper

    yield start
    for shipper in shippers:
        shipper.stop()


def run(docker_client: Any, image: str, node: str, launch: Launch, script: str) -> Any:
    labels = {LABEL_LAUNCH: launch.launch_id, LABEL_NODE: node}
    return docker_client.containers.run(image, ["sh", "-c", script], labels=labels, detach=True, network_mode="none")


def kept(launch: Launch) -> bytes:
    return b"".join(bytes(c.data) for c in LaunchLogChunk.objects.filter(log__launch=launch).order_by("offset"))


def log_row(launch: Launch) -> LaunchLog | None:
    return LaunchLog.objects.filter(launch=launch).first()


def received(launch: Launch) -> int:
    row = log_row(launch)
    return row.received if row else 0


def complete(launch: Launch) -> bool:
    row = log_row(launch)
    return bool(row and row.eof)


def test_lines_written_in_the_container_reach_a_follower_within_two_seconds(
    plane: dict[str, Any], ship: Callable[..., LogShipper], docker_client: Any, busybox_image: str, node: str
) -> None:
    launch = plane["launch"]
    token: Any = ApiTokenFactory(user=plane["owner"])
    url = f"{plane['url']}/api/v1/reservations/{launch.reservation.public_id}/logs/?follow=1"
    follower = Follower(url, token.plaintext, clock=lambda: time.clock_gettime(time.CLOCK_BOOTTIME))
    try:
        ship()
        # /proc/uptime is the host's boot clock in the container too: each line carries when it was written.
        script = (
            'i=0; while [ $i -lt 40 ]; do read up rest < /proc/uptime; echo "line $i at $up"; '
            'echo "err $i" >&2; i=$((i+1)); sleep 0.1; done'
        )
        container = run(docker_client, busybox_image, node, launch, script)
        wait_for(lambda: complete(launch), timeout=20, what="the end of the output")
        follower.wait(lambda: follower.texts().count("line ") == 40, timeout=5)
        latencies = []
        for event, arrived in zip(follower.events, follower.arrived, strict=True):
            for line in follower.text_of(event).splitlines():
                if line.startswith("line "):
                    latencies.append(arrived - float(line.rsplit(" ", 1)[1]))
        p95 = statistics.quantiles(latencies, n=20)[-1]
        assert p95 < 2.0, sorted(latencies)
        # stdout and stderr as Docker interleaves them, every byte once.
        assert kept(launch) == container.logs(stdout=True, stderr=True)
        assert b"err 39\n" in kept(launch)
    finally:
        follower.close()


def test_a_restarted_shipper_resends_nothing_the_control_plane_has(
    plane: dict[str, Any], ship: Callable[..., LogShipper], docker_client: Any, busybox_image: str, node: str
) -> None:
    launch, switch = plane["launch"], plane["switch"]
    script = (
        "i=0; while [ $i -lt 3000 ]; do echo \"a $i $(printf '%060d' 0)\"; i=$((i+1)); done; "
        'while [ ! -f /tmp/go ]; do sleep 0.05; done; i=0; while [ $i -lt 20 ]; do echo "b $i"; i=$((i+1)); done'
    )
    container = run(docker_client, busybox_image, node, launch, script)
    first_part = sum(len(f"a {i} {'0' * 60}\n") for i in range(3000))
    wait_for(lambda: len(container.logs()) == first_part, what="phase a")
    first = ship()
    wait_for(lambda: received(launch) == first_part, timeout=20, what="phase a at the control plane")
    first.stop()
    before = switch.sent
    second = ship()  # a new agent process: it reads the log from the start again
    wait_for(lambda: launch.launch_id in second.status() and second.status()[launch.launch_id]["acked"] is not None)
    container.exec_run(["touch", "/tmp/go"])
    wait_for(lambda: complete(launch), timeout=20, what="the end of the output")
    assert kept(launch) == container.logs(stdout=True, stderr=True)
    # The second shipper sent the 20 new lines and its requests, not the 200 KB again (in base64: 268 KB).
    assert switch.sent - before < 20_000, switch.sent - before


def test_an_outage_delays_the_output_and_loses_none_of_it(
    plane: dict[str, Any], ship: Callable[..., LogShipper], docker_client: Any, busybox_image: str, node: str
) -> None:
    launch, switch = plane["launch"], plane["switch"]
    script = (
        "echo before; while [ ! -f /tmp/go ]; do sleep 0.05; done; "
        'i=0; while [ $i -lt 50 ]; do echo "during $i"; i=$((i+1)); done; '
        "while [ ! -f /tmp/end ]; do sleep 0.05; done; echo after"
    )
    container = run(docker_client, busybox_image, node, launch, script)
    shipper = ship()
    wait_for(lambda: kept(launch) == b"before\n", timeout=10, what="the first line")
    switch.down()
    container.exec_run(["touch", "/tmp/go"])
    total = wait_for(lambda: b"during 49\n" in (out := container.logs()) and len(out), what="the output during")
    wait_for(lambda: shipper.status()[launch.launch_id]["read"] == total, what="the shipper read it")
    time.sleep(1.0)  # a few failed posts
    assert kept(launch) == b"before\n"
    switch.up()
    container.exec_run(["touch", "/tmp/end"])
    wait_for(lambda: complete(launch), timeout=20, what="the end of the output")
    assert kept(launch) == container.logs(stdout=True, stderr=True)


def test_an_outage_longer_than_the_buffer_drops_the_oldest_and_the_api_shows_the_hole(
    plane: dict[str, Any], ship: Callable[..., LogShipper], docker_client: Any, busybox_image: str, node: str
) -> None:
    launch, switch = plane["launch"], plane["switch"]
    script = (
        "echo before; while [ ! -f /tmp/go ]; do sleep 0.05; done; "
        'i=0; while [ $i -lt 1000 ]; do echo "during $i"; i=$((i+1)); done; '
        "while [ ! -f /tmp/end ]; do sleep 0.05; done; echo after"
    )
    container = run(docker_client, busybox_image, node, launch, script)
    shipper = ship(max_pending_bytes=4096)
    wait_for(lambda: kept(launch) == b"before\n", timeout=10, what="the first line")
    switch.down()
    container.exec_run(["touch", "/tmp/go"])
    total = wait_for(lambda: b"during 999\n" in (out := container.logs()) and len(out), what="the output during")
    wait_for(lambda: shipper.status()[launch.launch_id]["read"] == total, what="the shipper read it")
    assert shipper.status()[launch.launch_id]["pending"] <= 4096
    switch.up()
    # The newest 4096 bytes arrive once the shipper's backoff lets it try again; only then the last line, which
    # would otherwise push 6 more bytes out of the full buffer.
    wait_for(lambda: received(launch) == total, timeout=15, what="the buffer at the control plane")
    container.exec_run(["touch", "/tmp/end"])
    wait_for(lambda: complete(launch), timeout=20, what="the end of the output")
    written = container.logs(stdout=True, stderr=True)
    api = APIClient()
    api.force_authenticate(plane["owner"])
    [entry] = api.get(f"/api/v1/reservations/{launch.reservation.public_id}/logs/").json()["launches"]
    [gap] = entry["gaps"]
    assert gap["offset"] == len(b"before\n") and gap["bytes"] == total - 4096 - len(b"before\n")
    assert kept(launch) == written[: gap["offset"]] + written[gap["offset"] + gap["bytes"] :]
    assert entry["next_offset"] == len(written) and entry["eof"]


def test_output_journaled_in_an_outage_arrives_after_the_container_and_the_agent_are_gone(
    plane: dict[str, Any],
    ship: Callable[..., LogShipper],
    docker_client: Any,
    busybox_image: str,
    node: str,
    tmp_path: Any,
) -> None:
    launch, switch = plane["launch"], plane["switch"]
    script = (
        "echo before; while [ ! -f /tmp/go ]; do sleep 0.05; done; "
        "i=0; while [ $i -lt 3000 ]; do echo \"during $i $(printf '%060d' 0)\"; i=$((i+1)); done"
    )
    container = run(docker_client, busybox_image, node, launch, script)
    # With the journal the in-memory limit does not apply: what waits is on disk, under the journal's bound.
    shipper = ship(journal=Journal(tmp_path / "journal"), max_pending_bytes=4096)
    wait_for(lambda: kept(launch) == b"before\n", timeout=10, what="the first line")
    switch.down()
    container.exec_run(["touch", "/tmp/go"])
    container.wait(timeout=20)
    written = container.logs(stdout=True, stderr=True)
    wait_for(lambda: shipper.status()[launch.launch_id]["read"] == len(written), what="the shipper read it all")
    assert shipper.status()[launch.launch_id]["pending"] == len(written) - len(b"before\n") > 200_000
    shipper.stop()  # the agent goes (its journal is on disk), and the runtime removes the exited container
    container.remove(force=True)
    switch.up()
    second = ship(journal=Journal(tmp_path / "journal"))  # the agent again, on the same state directory
    wait_for(lambda: complete(launch), timeout=30, what="the end of the output, from the journal")
    assert kept(launch) == written  # every byte, once, no hole
    wait_for(lambda: launch.launch_id not in second.status(), what="the launch to be done")
    assert not list((tmp_path / "journal" / "logs").iterdir())  # forgotten once acknowledged


def test_the_agent_ships_live_logs_with_the_docker_runtime_unless_told_not_to(
    make_runtime: Callable[..., Any], node: str
) -> None:
    from nodeagent.__main__ import build_parser, start_log_shipper

    runtime = make_runtime()
    base = ["run", "--server", "http://127.0.0.1:9"]
    shipper = start_log_shipper(build_parser().parse_args([*base, "--runtime", "docker"]), runtime, node, lambda: None)
    try:
        assert isinstance(shipper, LogShipper) and shipper.docker is runtime.client and shipper.node == node
    finally:
        assert shipper is not None
        shipper.stop()
    off = build_parser().parse_args([*base, "--runtime", "docker", "--no-live-logs"])
    assert start_log_shipper(off, runtime, node, lambda: None) is None
    assert (
        start_log_shipper(build_parser().parse_args([*base, "--runtime", "none"]), runtime, node, lambda: None) is None
    )
