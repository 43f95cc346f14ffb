"""The web proxy (docs/proxy.md) beside the same app reached directly: request latency, WebSocket round trips,
a 100 MB download, and the proxy's memory with 200 WebSockets open.

    .venv/bin/python bench/proxy.py [--requests 1000] [--echoes 1000] [--download-mb 100] [--sockets 200]

Needs a Docker engine (scripts/dockerd-up), root (to join the container's network namespace, as the gateway
does), the OpenSSH client and PostgreSQL (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/bench_proxy,
dropped and created afresh). ``--profile DIR`` writes cProfile files of the proxy process and the gateway's
thread (read them with ``python -m pstats``).

**Assembly.** The control plane runs in this process (Django's threaded server on a free port, Celery tasks
eager), with one real agent in a thread: `Agent` + `DockerRuntime` + the node's `SshGateway`, simulated GPUs, as
an agent runs on a node. The demo tenant books one GPU through the API with a named port (``app``, 9000); its
container is the busybox test image sleeping, on ``network: none``. The app is an aiohttp server (HTTP and
WebSockets) in a child process of this bench that joins the container's network namespace (``setns``, as the
gateway does to connect) before it listens, so it listens on the container's own 127.0.0.1:9000 as an app in
the container would, in a process of its own, whatever the image holds. The proxy is ``manage.py runproxy`` in
a child process of its own, on the same database and SECRET_KEY, so its VmRSS is its own. An Open link from
the API becomes the app's cookie, as in a browser.

**Method.** One client process (aiohttp) holds two sessions: one to the proxy (127.0.0.1, the app's host name in
the Host header, the cookie), and the baseline, one straight to the app: its sockets are created inside the
container's network namespace, so they reach the same server on the same loopback port with nothing between.
Both keep their connection alive, as a browser does; the first requests (the proxy's SSH connection and
forward, the grant's first read) are warm-up and not counted. Then, in the same run:

1. **HTTP latency**: ``--requests`` GETs of a 100-byte body on each path, interleaved one by one; p50, p95.
   Goal: p95 through the proxy at most 20 ms over p95 direct (loopback).
2. **WebSocket round trip**: one WebSocket on each path, ``--echoes`` 100-byte text messages echoed by the
   app, interleaved; p50, p95.
3. **Download**: a ``--download-mb`` MiB body, three times on each path, interleaved; the best of the three in
   MB/s on each. Goal: through the proxy at least 50% of direct. A third path, in the same rounds, is the
   tenant's own way to the port: OpenSSH's ``ssh -N -L`` through the same gateway (same user, AES-GCM), which
   tells the gateway's share from the proxy's. Beside each, the CPU seconds each process on the path spent
   per download (/proc: the client, the relay (the proxy process, or the ssh client), the gateway's thread, the
   app): on a shared machine a throughput varies with what else runs, its CPU per byte much less.
4. **Memory**: the proxy process's VmRSS once started, before the part (after parts 1-3, its SSH connection
   open), and with ``--sockets`` WebSockets open through it at once (each answered an echo), per socket.
   Goal: the proxy holds 200.

The machine's cores are shared by every process on the path (client, proxy, this process's gateway thread,
the app), as on a small node; the figures are ratios and differences against the same-run baselines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import django_on_fresh_database, free_port, pct, stat_cpu

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_proxy"
APP_PORT = 9000
SMALL = b"x" * 100
CHUNK = 1 << 20  # the app writes its download in 1 MiB pieces
DOWNLOADS = ("direct", "proxy", "ssh -L")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def join_netns(pid: int) -> None:
    """Move the calling thread into the network namespace of process ``pid`` (as the gateway does)."""
    from nodeagent.gateway.netns import _setns

    with open(f"/proc/{pid}/ns/net", "rb") as namespace:
        _setns(namespace.fileno())


# -- the app: HTTP and WebSockets on the container's loopback (a child process) -----------------------------


def serve_app(netns_pid: int, port: int) -> None:
    """Join the container's network namespace, listen on its 127.0.0.1:``port``, serve until killed."""
    from aiohttp import WSMsgType, web

    join_netns(netns_pid)  # before any thread or socket: everything this process opens is in the container
    body = os.urandom(CHUNK)

    async def small(_: web.Request) -> web.Response:
        return web.Response(body=SMALL, content_type="application/octet-stream")

    async def download(request: web.Request) -> web.StreamResponse:
        mib = int(request.query.get("mb", "100"))
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = mib * CHUNK
        await response.prepare(request)
        for _ in range(mib):
            await response.write(body)
        await response.write_eof()
        return response

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await ws.send_str(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/small", small)
    app.router.add_get("/download", download)
    app.router.add_get("/ws", echo)
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- the client (a child process) ---------------------------------------------------------------------------


def netns_socket_factory(pid: int) -> Callable[[Any], socket.socket]:
    """aiohttp's socket factory for the direct path: each socket is made by a fresh thread inside the
    container's network namespace (a socket stays in the namespace it was made in), then used here."""

    def make(addr_info: Any) -> socket.socket:
        family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
        out: dict[str, Any] = {}

        def create() -> None:
            try:
                join_netns(pid)
                out["sock"] = socket.socket(family, kind, proto)
            except OSError as exc:
                out["error"] = exc

        thread = threading.Thread(target=create, name="bench-netns")
        thread.start()
        thread.join()
        if "error" in out:
            raise out["error"]
        sock: socket.socket = out["sock"]
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    return make


async def client(spec: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    proxied_base = f"http://127.0.0.1:{spec['proxy_port']}"
    direct_base = f"http://127.0.0.1:{spec['app_port']}"
    proxied_headers = {"Host": spec["host"], "Cookie": spec["cookie"]}

    def session(factory: Any = None) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, socket_factory=factory),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=300),
        )

    proxied = session()
    direct = session(netns_socket_factory(spec["netns_pid"]))
    paths = {"proxy": (proxied, proxied_base, proxied_headers), "direct": (direct, direct_base, {})}
    out: dict[str, Any] = {"rss_started_kib": rss_kib(spec["proxy_pid"])}

    async def get(path: str, which: str) -> float:
        s, base, headers = paths[which]
        t0 = time.perf_counter()
        async with s.get(base + path, headers=headers) as response:
            data = await response.read()
        elapsed = time.perf_counter() - t0
        if response.status != 200 or data != SMALL:
            raise RuntimeError(f"{which} GET {path}: {response.status} {data[:200]!r}")
        return elapsed

    # 1. HTTP latency, interleaved, after a warm-up (the SSH connection, the forward, the grant's first read).
    for _ in range(20):
        for which in paths:
            await get("/small", which)
    http: dict[str, list[float]] = {"proxy": [], "direct": []}
    for i in range(spec["requests"]):
        for which in ("proxy", "direct") if i % 2 else ("direct", "proxy"):
            http[which].append(await get("/small", which))
    out["http"] = http

    # 2. WebSocket round trips, interleaved.
    sockets = {
        which: await s.ws_connect(base + "/ws", headers=headers, max_msg_size=0)
        for which, (s, base, headers) in paths.items()
    }
    message = "m" * 100
    echo: dict[str, list[float]] = {"proxy": [], "direct": []}
    for i in range(spec["echoes"] + 20):
        for which in ("proxy", "direct") if i % 2 else ("direct", "proxy"):
            ws = sockets[which]
            t0 = time.perf_counter()
            await ws.send_str(message)
            msg = await ws.receive()
            elapsed = time.perf_counter() - t0
            if msg.type != aiohttp.WSMsgType.TEXT or msg.data != message:
                raise RuntimeError(f"{which} WebSocket echo: {msg.type} {str(msg.data)[:200]}")
            if i >= 20:
                echo[which].append(elapsed)
    for ws in sockets.values():
        await ws.close()
    out["echo"] = echo

    # 3. The download, three times each, interleaved, and through `ssh -L`; with the CPU each process on the
    # path spent on it.
    size = spec["download_mb"] * CHUNK
    stats = {name: Path(path) for name, path in spec["cpu"].items()}
    stats["client"] = Path("/proc/self/stat")
    plain = session()
    paths["ssh -L"] = (plain, f"http://127.0.0.1:{spec['ssh_port']}", {})
    download: dict[str, list[float]] = {which: [] for which in DOWNLOADS}
    cpu: dict[str, dict[str, float]] = {which: {} for which in DOWNLOADS}
    for i in range(3):
        for which in DOWNLOADS[i:] + DOWNLOADS[:i]:
            s, base, headers = paths[which]
            before = {name: stat_cpu(path) for name, path in stats.items()}
            t0 = time.perf_counter()
            got = 0
            async with s.get(f"{base}/download?mb={spec['download_mb']}", headers=headers) as response:
                async for chunk in response.content.iter_any():
                    got += len(chunk)
            elapsed = time.perf_counter() - t0
            if response.status != 200 or got != size:
                raise RuntimeError(f"{which} download: {response.status}, {got} of {size} bytes")
            download[which].append(elapsed)
            for name, path in stats.items():
                cpu[which][name] = cpu[which].get(name, 0.0) + (stat_cpu(path) - before[name]) / 3
    out["download_s"] = download
    out["download_cpu_s"] = cpu

    # 4. Many WebSockets held open through the proxy at once.
    await asyncio.sleep(1.0)
    out["rss_before_kib"] = rss_kib(spec["proxy_pid"])
    gate = asyncio.Semaphore(20)

    async def open_one(i: int) -> aiohttp.ClientWebSocketResponse:
        async with gate:
            ws = await proxied.ws_connect(proxied_base + "/ws", headers=proxied_headers, max_msg_size=0)
            await ws.send_str(f"hello {i}")
            msg = await ws.receive()
            if msg.data != f"hello {i}":
                raise RuntimeError(f"WebSocket {i}: {msg.type} {str(msg.data)[:200]}")
            return ws

    t0 = time.perf_counter()
    held = await asyncio.gather(*(open_one(i) for i in range(spec["sockets"])))
    out["open_all_s"] = time.perf_counter() - t0
    await asyncio.sleep(1.0)
    out["rss_open_kib"] = rss_kib(spec["proxy_pid"])
    # Each is still alive after the others opened: one more echo on every one.
    for i, ws in enumerate(held):
        await ws.send_str(f"again {i}")
        if (await ws.receive()).data != f"again {i}":
            raise RuntimeError(f"WebSocket {i} did not answer a second time")
    out["held"] = len(held)
    await asyncio.gather(*(ws.close() for ws in held))
    await proxied.close()
    await direct.close()
    await plain.close()
    return out


# -- the control plane, the node, the booking (this process) ------------------------------------------------


def start_node(docker_client: Any, url: str, directory: Path) -> tuple[Any, Any, threading.Thread, str]:
    """One node as an agent runs it: Agent + DockerRuntime + SshGateway, simulated GPUs, in a thread."""
    from controlplane.fleet import services as fleet
    from nodeagent.agent import Agent, AgentState
    from nodeagent.backends.simulated import SimulatedBackend
    from nodeagent.client import ControlPlaneClient
    from nodeagent.collectors import HostCollector
    from nodeagent.gateway import SshGateway
    from nodeagent.runtime.docker import DockerRuntime

    hostname = f"bench-proxy-{uuid.uuid4().hex[:6]}"
    _, join_token = fleet.join_token_create(actor=None, note="bench proxy")
    runtime = DockerRuntime(state_dir=directory / "runtime", client=docker_client, node=hostname, nvidia_runtime=False)
    gateway = SshGateway(
        state_dir=directory / "agent", node=hostname, docker_client=docker_client, bind=("127.0.0.1", 0),
        address="127.0.0.1", tick_s=0.5,
    )  # fmt: skip
    gateway.start()
    agent = Agent(
        client=ControlPlaneClient(url, timeout=10),
        backend=SimulatedBackend("1xH100-80GB", hostname=hostname, busy_source=runtime.busy_gpus),
        runtime=runtime,
        state=AgentState(directory / "agent"),
        host=HostCollector(hostname=hostname),
        join_token=join_token,
        interval=1.0,
        gateway=gateway,
    )
    gateway.on_session = agent.post_event
    thread = threading.Thread(target=agent.run, name=hostname, daemon=True)
    thread.start()
    return agent, gateway, thread, hostname


def start_proxy(env: dict[str, str], log_path: Path, profile: Path | None) -> tuple[subprocess.Popen[bytes], int]:
    import requests
    from dispatch import wait_until

    port = free_port()
    proxy_env = {**env, "PROXY_PUBLIC_URL": f"http://localhost:{port}", "PROXY_APPS_URL": f"http://*.localhost:{port}"}
    profiled = ["-m", "cProfile", "-o", str(profile / "proxy.prof")] if profile else []
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *profiled, "manage.py", "runproxy", "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT, env=proxy_env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def up() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"the proxy exited with {proc.returncode}: see {log_path}")
        try:
            return requests.get(f"http://127.0.0.1:{port}/_gpucp/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    wait_until(up, 60, "the proxy")
    return proc, port


def start_ssh_forward(directory: Path, gateway: Any, user: str, reservation: str) -> tuple[subprocess.Popen[Any], int]:
    """OpenSSH's ``ssh -N -L`` to the app's port through the same gateway, with the same user's portal key: the
    tenant's own way to the port, for the download's second reference."""
    from dispatch import wait_until

    from controlplane.access.web.portalkeys import portal_key

    key = directory / "portal_key"
    key.write_bytes(portal_key(user).private_openssh)
    key.chmod(0o600)
    known = directory / "known_hosts"
    known.write_text(f"[127.0.0.1]:{gateway.port} {gateway.host_key_line}\n")
    port = free_port()
    proc = subprocess.Popen(
        ["ssh", "-N", "-p", str(gateway.port), "-i", str(key), "-o", "IdentitiesOnly=yes",
         "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
         "-o", "LogLevel=ERROR", "-o", "Ciphers=aes128-gcm@openssh.com",
         "-L", f"127.0.0.1:{port}:localhost:{APP_PORT}", f"{reservation}@127.0.0.1"],
    )  # fmt: skip

    def listening() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"ssh -L exited with {proc.returncode}")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, 30, "ssh -L")
    return proc, port


def ms(values: list[float], q: float) -> float:
    return pct(values, q) * 1000


def report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    http, echo, download = figures["http"], figures["echo"], figures["download_s"]
    print(f"\n1. HTTP GET, 100-byte body, keep-alive, {args.requests} each, interleaved (ms)")
    print("                   p50      p95      p99")
    for which in ("direct", "proxy"):
        values = http[which]
        print(f"  {which:<10}  {ms(values, 0.5):7.2f}  {ms(values, 0.95):7.2f}  {ms(values, 0.99):7.2f}")
    over = ms(http["proxy"], 0.95) - ms(http["direct"], 0.95)
    print(f"  p95 overhead: {over:+.2f} ms (goal: at most +20 ms): {'met' if over <= 20 else 'NOT met'}")

    print(f"\n2. WebSocket echo, 100-byte text, {args.echoes} round trips each, interleaved (ms)")
    print("                   p50      p95      p99")
    for which in ("direct", "proxy"):
        values = echo[which]
        print(f"  {which:<10}  {ms(values, 0.5):7.2f}  {ms(values, 0.95):7.2f}  {ms(values, 0.99):7.2f}")
    ws_over = ms(echo["proxy"], 0.95) - ms(echo["direct"], 0.95)
    print(f"  p95 overhead: {ws_over:+.2f} ms")

    mb = args.download_mb * (1 << 20) / 1e6
    print(f"\n3. download of {args.download_mb} MiB, 3 each, interleaved: best of 3 (MB/s)")
    rates = {which: mb / min(download[which]) for which in DOWNLOADS}
    cpu = figures["download_cpu_s"]
    print(f"  {'':<10}  {'MB/s':>7}    {'runs':<18}   CPU seconds per download, mean of 3:")
    print(f"  {'':<10}  {'':>7}    {'':<18}   " + " ".join(f"{n:>8}" for n in ("client", "relay", "gateway", "app")))
    for which in DOWNLOADS:
        runs = ", ".join(f"{mb / s:4.0f}" for s in download[which])
        relay = {"proxy": "proxy", "ssh -L": "ssh"}.get(which)
        used = [cpu[which]["client"], cpu[which][relay] if relay else None,
                cpu[which]["gateway"] if relay else None, cpu[which]["app"]]  # fmt: skip
        cells = " ".join("       -" if v is None else f"{v:8.2f}" for v in used)
        print(f"  {which:<10}  {rates[which]:7.0f}    {runs:<18}   {cells}")
    share = rates["proxy"] / rates["direct"]
    print(f"  proxy / direct: {share:.0%} (goal: at least 50%): {'met' if share >= 0.5 else 'NOT met'}; "
          f"proxy / ssh -L: {rates['proxy'] / rates['ssh -L']:.0%}")  # fmt: skip

    started, before, opened = figures["rss_started_kib"], figures["rss_before_kib"], figures["rss_open_kib"]
    n = figures["held"]
    print(f"\n4. proxy process memory (VmRSS), {args.sockets} WebSockets through it at once")
    print(f"  once started: {started / 1024:.1f} MiB; before: {before / 1024:.1f} MiB; with {n} open: "
          f"{opened / 1024:.1f} MiB")  # fmt: skip
    print(f"  per WebSocket: {(opened - before) / max(1, n):.0f} KiB; {n} opened (each echoed) in "
          f"{figures['open_all_s']:.2f} s")  # fmt: skip
    print(f"  goal {args.sockets} held: {'met' if n >= args.sockets else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--echoes", type=int, default=1000)
    parser.add_argument("--download-mb", type=int, default=100)
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--profile", metavar="DIR", type=Path, help="write cProfile files of the proxy and gateway")
    parser.add_argument("--app", nargs=2, type=int, metavar=("PID", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--client", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.app:
        serve_app(*args.app)
        return
    if args.client:
        print(json.dumps(asyncio.run(client(json.loads(args.client)))), flush=True)
        return

    _, env = django_on_fresh_database("proxy", DEFAULT_URL, CELERY_TASK_ALWAYS_EAGER="true")
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    import docker
    import requests
    from dispatch import start_web, wait_until

    from controlplane.accounts.models import Project
    from controlplane.accounts.services import api_token_create
    from controlplane.dispatch.models import Launch
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import Server
    from controlplane.reservations.choices import ReservationState
    from controlplane.reservations.models import Reservation
    from controlplane.system.management.demo import seed_demo
    from nodeagent.runtime.containers import LABEL_NODE
    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

    docker_client = docker.from_env(timeout=60)
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    seed_demo()
    httpd, web = start_web()
    directory = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    agent, gateway, thread, hostname = start_node(docker_client, web, directory)
    children: list[subprocess.Popen[Any]] = []
    try:
        server = wait_until(
            lambda: Server.objects.filter(hostname=hostname, gpus__isnull=False).first(), 60, "enrollment"
        )
        Server.objects.filter(pk=server.pk).update(state=ServerState.READY)
        alice = Project.objects.get(slug="demo").memberships.get().user
        _, token = api_token_create(user=alice, name="bench")
        auth = {"Authorization": f"Bearer {token}"}

        proxy, proxy_port = start_proxy(env, directory / "proxy.log", args.profile)
        children.append(proxy)

        answer = requests.post(
            f"{web}/api/v1/reservations/",
            json={
                "project": "demo",
                "name": "proxy-bench",
                "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
                "window": {"start": "now", "duration": 3600},
                "container": {
                    "image": DEFAULT_TAG,
                    "command": ["sleep", "7200"],
                    "ports": [{"name": "app", "port": APP_PORT}],
                },
            },
            headers=auth,
            timeout=30,
        )
        if answer.status_code != 201:
            raise SystemExit(f"booking failed: {answer.status_code} {answer.text}")
        public_id = answer.json()["id"]
        wait_until(
            lambda: Reservation.objects.get(public_id=public_id).state == ReservationState.RUNNING, 60, "running"
        )
        wait_until(
            lambda: Launch.objects.filter(reservation__public_id=public_id, state="running").exists(), 60, "launch"
        )
        [container] = docker_client.containers.list(filters={"label": f"{LABEL_NODE}={hostname}"})
        container.reload()
        netns_pid = int(container.attrs["State"]["Pid"])

        app = subprocess.Popen(
            [sys.executable, __file__, "--app", str(netns_pid), str(APP_PORT)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        children.append(app)
        assert app.stdout is not None
        if app.stdout.readline().strip() != "ready":
            raise SystemExit("the app server did not start")
        time.sleep(0.5)

        opened = requests.post(f"{web}/api/v1/reservations/{public_id}/open/", json={"port": "app"}, headers=auth,
                               timeout=30)  # fmt: skip
        if opened.status_code != 200:
            raise SystemExit(f"open failed: {opened.status_code} {opened.text}")
        link = opened.json()["url"]
        host = link.split("://", 1)[1].split("/", 1)[0]
        login = requests.get(
            f"http://127.0.0.1:{proxy_port}/{link.split('://', 1)[1].split('/', 1)[1]}",
            headers={"Host": host},
            allow_redirects=False,
            timeout=30,
        )
        cookie = login.cookies.get("gpucp_app")
        if login.status_code != 302 or not cookie:
            raise SystemExit(f"the link did not log in: {login.status_code} {login.text[:300]}")

        ssh, ssh_port = start_ssh_forward(directory, gateway, alice.username, public_id)
        children.append(ssh)

        [gateway_thread] = [t for t in threading.enumerate() if t.name == "gpucp-ssh-gateway"]
        spec = {
            "cpu": {
                "proxy": f"/proc/{proxy.pid}/stat",
                "gateway": f"/proc/{os.getpid()}/task/{gateway_thread.native_id}/stat",
                "app": f"/proc/{app.pid}/stat",
                "ssh": f"/proc/{ssh.pid}/stat",
            },
            "ssh_port": ssh_port,
            "proxy_port": proxy_port,
            "proxy_pid": proxy.pid,
            "host": host,
            "cookie": f"gpucp_app={cookie}",
            "netns_pid": netns_pid,
            "app_port": APP_PORT,
            "requests": args.requests,
            "echoes": args.echoes,
            "download_mb": args.download_mb,
            "sockets": args.sockets,
        }
        profiler = None
        if args.profile:
            import cProfile

            # Profiles the gateway's own thread alone: enabled from inside its event loop.
            profiler = cProfile.Profile()
            gateway._loop.call_soon_threadsafe(profiler.enable)
        out = subprocess.run(
            [sys.executable, __file__, "--client", json.dumps(spec)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if out.returncode != 0:
            raise SystemExit(f"the client failed:\n{out.stderr[-3000:]}")
        report(json.loads(out.stdout.strip().splitlines()[-1]), args)
        if profiler is not None:
            gateway._loop.call_soon_threadsafe(profiler.disable)
            time.sleep(0.5)
            profiler.dump_stats(args.profile / "gateway.prof")
    finally:
        for child in children:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        agent.stop()
        thread.join(timeout=10)
        gateway.close()
        httpd.shutdown()
        for c in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={hostname}"}):
            c.remove(force=True)


if __name__ == "__main__":
    main()
