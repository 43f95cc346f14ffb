"""A network partition for the fencing test: a TCP proxy the test stops and starts, an agent whose every road to and
from the control plane runs through such proxies, and the node-loss detector running as the beat would run it."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodeagent.agent import Agent, AgentState
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.client import Backoff, ControlPlaneClient
from nodeagent.collectors import HostCollector
from nodeagent.commands import COMMAND_PATH, CommandChannel
from nodeagent.runtime.docker import DockerRuntime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target``. ``stop()`` is the partition: the listening socket goes (new
    connections are refused) and every open connection is reset, keep-alive ones included; ``start()`` heals it
    on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR: the same port again at once
        listener.settimeout(0.1)
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept, args=(listener,), name="tcp-proxy", daemon=True)
        self._accepting.start()
        return self

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._accepting is not None:
            self._accepting.join(timeout=5)
            self._accepting = None
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            # Linger 0: close sends RST, so a peer mid-request sees "connection reset", as behind a dead link.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), name="tcp-proxy-pump", daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 0.2)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return  # reset by stop(), or closed under us
        finally:
            with self._lock:
                self._open.difference_update((a, b))
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()


class FrontedChannel(CommandChannel):
    """The agent's command listener, advertised at a proxy's port, so the control plane's pushes cross it too."""

    front_port: int | None = None

    @property
    def url(self) -> str | None:
        real = super().url
        if real is None or self.front_port is None:
            return real
        return f"http://127.0.0.1:{self.front_port}{COMMAND_PATH}"


class ProxiedAgent:
    """A real agent (simulated GPUs, the Docker runtime) in a thread. With ``proxied``, its heartbeats go to the
    control plane through one proxy and the control plane's pushes come through another; ``partition()`` stops
    both, ``heal()`` starts them again."""

    def __init__(
        self, *, url: str, docker_client: Any, state: Path, hostname: str, join_token: str, proxied: bool
    ) -> None:
        self.hostname = hostname
        holder: dict[str, Agent] = {}
        self.channel = FrontedChannel(
            credential=lambda: holder["a"].credential if holder else None,
            server_name=lambda: holder["a"].server_name if holder else None,
        ).start()
        self.proxies: list[TcpProxy] = []
        if proxied:
            host, port = url.removeprefix("http://").rsplit(":", 1)
            to_control_plane = TcpProxy((host, int(port))).start()
            listener = self.channel._httpd
            assert listener is not None
            to_agent = TcpProxy(("127.0.0.1", int(listener.server_address[1]))).start()
            self.channel.front_port = to_agent.port
            self.proxies = [to_control_plane, to_agent]
            url = to_control_plane.url
        self.runtime = DockerRuntime(
            state_dir=state / "runtime", client=docker_client, node=hostname, nvidia_runtime=False
        )
        self.agent = holder["a"] = Agent(
            client=ControlPlaneClient(url, timeout=10),
            backend=SimulatedBackend("2xH100-80GB", hostname=hostname, busy_source=self.runtime.busy_gpus),
            runtime=self.runtime,
            state=AgentState(state / "agent"),
            host=HostCollector(hostname=hostname),
            join_token=join_token,
            interval=0.5,
            commands=self.channel,
            # Short waits after the partition heals, so the test sees the return within seconds.
            backoff=Backoff(base_s=0.5, cap_s=2.0),
        )
        self.thread = threading.Thread(target=self.agent.run, name=f"agent-{hostname}", daemon=True)
        self.thread.start()

    def partition(self) -> None:
        for proxy in self.proxies:
            proxy.stop()

    def heal(self) -> None:
        for proxy in self.proxies:
            proxy.start()

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(timeout=15)
        self.channel.close()
        for proxy in self.proxies:
            proxy.stop()


class Beat:
    """``detect_lost_servers`` every ``period`` seconds in a thread, as Celery beat runs it; errors are kept."""

    def __init__(self, task: Callable[[], Any], *, period: float = 0.2) -> None:
        self.task, self.period = task, period
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="beat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from django.db import connection

        try:
            while not self._stop.is_set():
                try:
                    self.task()
                except Exception as exc:  # kept for the test to fail on, the loop goes on like the beat's
                    self.errors.append(exc)
                self._stop.wait(self.period)
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
