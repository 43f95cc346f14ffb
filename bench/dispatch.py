"""Window opening -> container running, through the agent's signed command path, beside a bare `docker run`.

Each round pushes a signed command (as the control plane's push task does) whose launches open a moment
later; the agent's loop starts them on its own clock at the window start. Latency is the container's
StartedAt as Docker records it minus the window start. The baseline is `docker run -d` of the same image,
measured in the same run: StartedAt minus the moment the client was called.

    PYTHONPATH=. python bench/dispatch.py --reservations 50 --parallel 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta

import docker

from nodeagent import commands, schema
from nodeagent.runtime.docker import LABEL_NODE, DockerRuntime, parse_docker_time
from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

CREDENTIAL = "gcn_000000000000_bench"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_dispatch(client: docker.DockerClient, *, rounds: int, parallel: int, node: str) -> list[float]:
    channel = commands.CommandChannel(credential=lambda: CREDENTIAL, server_name=lambda: node).start()
    runtime = DockerRuntime(state_dir=tempfile.mkdtemp(), client=client, node=node, nvidia_runtime=False)
    key = commands.signing_key(CREDENTIAL)
    latencies: list[float] = []
    import requests

    try:
        for r in range(rounds):
            start = datetime.now(UTC) + timedelta(seconds=0.5)
            desired = [
                schema.DesiredContainer(
                    launch_id=f"bench-{uuid.uuid4().hex[:12]}",
                    reservation=f"r{r}-{i}",
                    project="bench",
                    image=DEFAULT_TAG,
                    command=["sleep", "30"],
                    gpu_uuids=[f"GPU-sim-{i:02d}"],
                    window_start=start,
                    window_end=start + timedelta(seconds=60),
                    warn_before_s=0,
                    stop_grace_s=0,
                )
                for i in range(parallel)
            ]
            body, headers = commands.signed_request(
                key=key, command=commands.new_command(server=node, desired=desired, stop=[])
            )
            assert channel.url
            requests.post(channel.url, data=body, headers=headers, timeout=5).raise_for_status()
            # The agent loop: take the command, then act at the window start on its own clock.
            for command in channel.take():
                channel.remember(command, seq=0)
            merged, stop = channel.merge([], [], reply_seq=None)
            runtime.reconcile(merged, stop, datetime.now(UTC))  # before the start: pending
            time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()))
            runtime.reconcile(merged, stop, datetime.now(UTC))
            for c in client.containers.list(filters={"label": f"{LABEL_NODE}={node}"}):
                c.reload()
                began = parse_docker_time(c.attrs["State"]["StartedAt"])
                if began and c.labels.get("gpucp.reservation", "").startswith(f"r{r}-"):
                    latencies.append((began - start).total_seconds())
            runtime.reconcile([], [d.launch_id for d in desired], datetime.now(UTC))
            for c in client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={node}"}):
                c.remove(force=True)
    finally:
        channel.close()
    return latencies


def bench_bare(client: docker.DockerClient, *, rounds: int, parallel: int) -> list[float]:
    latencies: list[float] = []
    for _ in range(rounds):
        for _ in range(parallel):
            called = datetime.now(UTC)
            c = client.containers.run(DEFAULT_TAG, ["sleep", "30"], detach=True, network_mode="none")
            c.reload()
            latencies.append((parse_docker_time(c.attrs["State"]["StartedAt"]) - called).total_seconds())
            c.remove(force=True)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reservations", type=int, default=50)
    parser.add_argument("--parallel", type=int, default=5)
    args = parser.parse_args()
    client = docker.from_env(timeout=60)
    ensure_busybox_image(client, DEFAULT_TAG)
    rounds = max(1, args.reservations // args.parallel)
    node = f"bench-{uuid.uuid4().hex[:8]}"
    dispatched = bench_dispatch(client, rounds=rounds, parallel=args.parallel, node=node)
    bare = bench_bare(client, rounds=rounds, parallel=args.parallel)
    print(f"{'path':<44}{'n':>5}{'p50 s':>9}{'p95 s':>9}{'max s':>9}")
    for name, values in (
        ("window start -> running (signed push, agent)", dispatched),
        ("bare docker run -d (baseline)", bare),
    ):
        print(
            f"{name:<44}{len(values):>5}{statistics.median(values):>9.3f}{pct(values, 0.95):>9.3f}{max(values):>9.3f}"
        )


if __name__ == "__main__":
    main()
