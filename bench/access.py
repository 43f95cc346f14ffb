"""Getting into a rented GPU: SSH through the agent's gateway beside `docker exec`, live-log latency, and the
gateway's memory with open sessions.

    .venv/bin/python bench/access.py [--rounds 40] [--sessions 20] [--log-lines 40]

Needs a Docker engine (scripts/dockerd-up), the local image (scripts/build-test-image) and the OpenSSH
client; the log part needs PostgreSQL (DATABASE_URL, default postgres://postgres@127.0.0.1:5432/bench_access,
dropped and created afresh).

1. **SSH connect to first output.** The gateway runs in a child process (`--serve`), as in an agent: a
   `DockerRuntime` launches one busybox container through `reconcile`, and the gateway accepts one ed25519
   key for its reservation. Each round runs `ssh ... -- echo ready` (a new connection: key exchange, public-key
   auth, a Docker exec) and, as the baseline in the same run, `docker exec CONTAINER echo ready` (the Docker
   CLI: a new API connection and the same exec), interleaved. Latency is the time from starting the process
   to the first byte on its stdout. Goal: p95 of SSH at most 150 ms over p95 of `docker exec`.
2. **Log follow.** The control plane in this process (Django's threaded server on a free port, a fresh
   PostgreSQL database), a real agent (`Agent` + `DockerRuntime` + the log shipper) in a thread, a container
   that writes a line with its own clock every 0.5 s, and a follower on
   `GET /reservations/{id}/logs/?follow=1`. Latency is the moment the follower read a line minus the time
   written in it (same machine, same clock); the baseline, in the same run, is the same lines read from the
   engine itself (`docker logs -f`). Goal: p95 at most 2 s.
3. **Gateway memory.** The gateway process's resident memory (VmRSS) with no session, and with `--sessions`
   interactive shells held open (`ssh -tt`, a shell waiting on its terminal).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import pct

REPO = Path(__file__).resolve().parents[1]


# -- the gateway host (a child process) ---------------------------------------------------------------------


def serve(directory: Path) -> None:
    """Launch one container and serve SSH for it; print what the client needs as one JSON line; run until
    stdin closes."""
    import docker

    from nodeagent import schema
    from nodeagent.gateway import SshGateway
    from nodeagent.runtime.docker import DockerRuntime
    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

    client = docker.from_env(timeout=60)
    ensure_busybox_image(client, DEFAULT_TAG)
    node = f"bench-access-{uuid.uuid4().hex[:8]}"
    public = (directory / "id_ed25519.pub").read_text().split()
    now = datetime.now(UTC)
    spec = schema.DesiredContainer(
        launch_id=f"launch-{uuid.uuid4().hex[:8]}",
        reservation=str(uuid.uuid4()),
        project="bench",
        image=DEFAULT_TAG,
        command=["sleep", "3600"],
        gpu_uuids=["GPU-bench-0001"],
        window_start=now - timedelta(seconds=1),
        window_end=now + timedelta(hours=1),
        ssh_keys=[schema.AuthorizedKey(user="bench", public_key=" ".join(public[:2]), fingerprint="SHA256:bench")],
    )
    runtime = DockerRuntime(state_dir=directory / "runtime", client=client, node=node, nvidia_runtime=False)
    try:
        runtime.reconcile([spec], [], datetime.now(UTC))
        runtime.wait_idle(60)
        runtime.reconcile([spec], [], datetime.now(UTC))
        [report] = runtime.report()
        gateway = SshGateway(state_dir=directory / "gateway", node=node, docker_client=client, bind=("127.0.0.1", 0))
        gateway.start()
        gateway.update([spec], [], datetime.now(UTC))
        print(
            json.dumps(
                {
                    "port": gateway.port,
                    "host_key": gateway.host_key_line,
                    "user": spec.reservation,
                    "container": report.container_id,
                    "state": report.state,
                }
            ),
            flush=True,
        )
        sys.stdin.read()  # until the parent closes it
        gateway.close()
    finally:
        for container in client.containers.list(all=True, filters={"label": f"gpucp.node={node}"}):
            container.remove(force=True)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def first_output_s(argv: list[str]) -> tuple[float, int]:
    """Seconds from starting ``argv`` to the first byte on its stdout, and its exit status."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    elapsed = time.perf_counter() - started
    proc.stdout.read()
    code = proc.wait()
    if not first:
        raise RuntimeError(
            f"{argv[0]} printed nothing (exit {code}): {proc.stderr.read().decode() if proc.stderr else ''}"
        )
    return elapsed, code


def bench_ssh(args: argparse.Namespace) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="bench-access-"))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "id_ed25519")], check=True)
    host = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    assert host.stdout is not None and host.stdin is not None
    ready, _, _ = select.select([host.stdout], [], [], 120)
    if not ready:
        host.kill()
        raise SystemExit("the gateway host did not start within 120 s")
    info = json.loads(host.stdout.readline())
    known = directory / "known_hosts"
    known.write_text(f"[127.0.0.1]:{info['port']} {info['host_key']}\n")
    ssh = ["ssh", "-p", str(info["port"]), "-i", str(directory / "id_ed25519"), "-o", "IdentitiesOnly=yes",
           "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
           "-o", "LogLevel=ERROR"]  # fmt: skip
    target = f"{info['user']}@127.0.0.1"
    docker_exec = ["docker", "exec", info["container"], "echo", "ready"]
    try:
        for _ in range(3):  # warm both paths (page cache, the engine's first exec)
            first_output_s([*ssh, target, "--", "echo", "ready"])
            first_output_s(docker_exec)
        ssh_s: list[float] = []
        exec_s: list[float] = []
        for _ in range(args.rounds):
            ssh_s.append(first_output_s([*ssh, target, "--", "echo", "ready"])[0])
            exec_s.append(first_output_s(docker_exec)[0])
        idle_kib = rss_kib(host.pid)
        sessions = []
        for _ in range(args.sessions):
            proc = subprocess.Popen(
                [*ssh, "-tt", target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            sessions.append(proc)
        # Each shell is open once it printed its prompt.
        for proc in sessions:
            assert proc.stdout is not None
            readable, _, _ = select.select([proc.stdout], [], [], 30)
            if not readable:
                raise RuntimeError("an interactive session printed nothing within 30 s")
            os.read(proc.stdout.fileno(), 4096)
        time.sleep(1.0)
        busy_kib = rss_kib(host.pid)
        for proc in sessions:
            proc.kill()
            proc.wait()
    finally:
        host.stdin.close()
        host.wait(timeout=60)
        shutil.rmtree(directory, ignore_errors=True)
    return {"ssh": ssh_s, "exec": exec_s, "idle_kib": idle_kib, "busy_kib": busy_kib, "sessions": args.sessions}


def ms(values: list[float], q: float) -> str:
    return f"{pct(values, q / 100) * 1000:7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--log-lines", type=int, default=40)
    parser.add_argument("--skip-logs", action="store_true", help="only the SSH and memory parts")
    parser.add_argument("--serve", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve))
        return

    result = bench_ssh(args)
    ssh_s, exec_s = result["ssh"], result["exec"]
    print(f"\n1. connect to first output, {args.rounds} rounds each, interleaved (ms)")
    print("                       p50      p95      max")
    print(f"  ssh via gateway   {ms(ssh_s, 50)}  {ms(ssh_s, 95)}  {max(ssh_s) * 1000:7.1f}")
    print(f"  docker exec (CLI) {ms(exec_s, 50)}  {ms(exec_s, 95)}  {max(exec_s) * 1000:7.1f}")
    over = (pct(ssh_s, 0.95) - pct(exec_s, 0.95)) * 1000
    print(f"  p95 over docker exec: {over:+.1f} ms (goal: at most +150 ms): {'met' if over <= 150 else 'NOT met'}")

    if not args.skip_logs:
        # Its own process: it sets Django up on a fresh database, which this one must not carry.
        out = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("access_logs.py")), "--lines", str(args.log_lines)],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        )
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        lag, engine = figures["lag_s"], figures["engine_lag_s"]
        print(f"\n2. log follow, {len(lag)} lines: written in the container -> read by the follower (ms)")
        print("                               p50      p95      max")
        print(f"  API follower (SSE)        {ms(lag, 50)}  {ms(lag, 95)}  {max(lag) * 1000:7.1f}")
        if engine:
            print(f"  docker logs -f (baseline) {ms(engine, 50)}  {ms(engine, 95)}  {max(engine) * 1000:7.1f}")
        print(f"  goal p95 <= 2000 ms: {'met' if pct(lag, 0.95) <= 2.0 else 'NOT met'}")

    idle, busy, n = result["idle_kib"], result["busy_kib"], result["sessions"]
    print("\n3. gateway process memory (VmRSS)")
    print(f"  no session: {idle / 1024:.1f} MiB; {n} open interactive sessions: {busy / 1024:.1f} MiB")
    print(f"  per session: {(busy - idle) / max(1, n):.0f} KiB")


if __name__ == "__main__":
    main()
