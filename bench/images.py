"""Window opening -> container running when the image comes from a registry: pre-pulled against pulled at the
opening, beside a bare `docker pull` + `docker run` and a bare `docker run` of a present image, in the same run.

    .venv/bin/python bench/images.py [--sizes 50,500] [--runs 3] [--lead 3]

A real registry (Debian's docker-registry, as the tests use) is started on a free loopback port with an htpasswd
user; for every size (MB) an image of its own is built from the local test image plus one layer of that many
random bytes (so nothing of it is on the engine but the base) and pushed there under a private name.

Paths, each measured ``--runs`` times per size, the image removed from the engine before every run that pulls:

- agent, pre-pulled: the node agent's ImagePuller pulls it ahead (what ``HeartbeatReply.prepull`` does), the launch
  arrives ``--lead`` s before its window (as the control plane sends it DISPATCH_LEAD_S early) and the runtime
  creates the container then and starts it at the window.
- agent, pulled at opening: the launch arrives at its window with the image absent: the runtime pulls it (in its
  pull pool, with the launch's credentials), creates and starts it.
- bare docker pull + docker run: the SDK's pull then ``containers.run(detach=True)``, from the moment it is called.
- bare docker run (present): ``containers.run(detach=True)`` of the pulled image.

Latency is the container's State.StartedAt as Docker recorded it, minus the window's start (agent) or the moment
the client was called (bare). Goal (the issue's): with pre-pull, p95 <= p95 of the bare `docker run` (present) +
0.5 s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
JOB = ["sh", "-c", 'trap "exit 0" TERM; while true; do sleep 0.1; done']
USER, PASSWORD = "bench", "bench-registry-pw"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def started_at(container: Any) -> datetime:
    from nodeagent.runtime.containers import parse_docker_time

    container.reload()
    value = parse_docker_time(container.attrs["State"]["StartedAt"])
    assert value is not None, "the container never started"
    return value


def drop(client: Any, image: str) -> None:
    from tests.runtime.image_support import remove_image

    remove_image(client, image)


def agent_run(client: Any, image: str, auth: Any, *, prepull: bool, lead: float, state: Path) -> float:
    """One launch through the agent's runtime; seconds from its window's start to the container's start."""
    from nodeagent import schema
    from nodeagent.runtime.docker import DockerRuntime

    node = f"bench-images-{uuid.uuid4().hex[:8]}"
    runtime = DockerRuntime(state_dir=state / node, client=client, node=node, nvidia_runtime=False)
    try:
        if prepull:
            runtime.images.ensure(image, auth)
        window = datetime.now(UTC) + timedelta(seconds=lead if prepull else 0.0)
        spec = schema.DesiredContainer(
            launch_id=f"launch-{node}",
            reservation=f"res-{node}",
            project="bench",
            image=image,
            command=JOB,
            gpu_uuids=[f"GPU-{uuid.uuid4()}"],
            window_start=window,
            window_end=window + timedelta(minutes=30),
            warn_before_s=0,
            stop_grace_s=1,
            registry_auth=auth,
        )
        if prepull:  # the launch arrives ahead: the container is created now, started at the window
            runtime.reconcile([spec], [], datetime.now(UTC))
            runtime.wait_idle(120)
            runtime.reconcile([spec], [], datetime.now(UTC))
            pause = (window - datetime.now(UTC)).total_seconds()
            if pause > 0:
                time.sleep(pause)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            runtime.reconcile([spec], [], max(datetime.now(UTC), window))
            [report] = [r for r in runtime.report() if r.launch_id == spec.launch_id]
            if report.state == "running":
                break
            if report.state == "failed":
                raise RuntimeError(f"the launch failed: {report.error}")
            runtime.wait_idle(0.05)
        else:
            raise RuntimeError("the launch did not start within 600 s")
        container = client.containers.get(report.container_id)
        latency = (started_at(container) - window).total_seconds()
        container.remove(force=True)
        return latency
    finally:
        runtime.close()


def bare_run(client: Any, image: str, auth: dict[str, str] | None) -> float:
    """`docker pull` (when ``auth`` is given) then `docker run -d`; seconds from the call to the start."""
    began = datetime.now(UTC)
    if auth is not None:
        repository, _, tag = image.rpartition(":")
        client.images.pull(repository, tag=tag, auth_config=auth)
    container = client.containers.run(
        image, JOB, detach=True, network_mode="none", name=f"bench-{uuid.uuid4().hex[:8]}"
    )
    latency = (started_at(container) - began).total_seconds()
    container.remove(force=True)
    return latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,500", help="image sizes in MB, comma-separated (default 50,500)")
    parser.add_argument("--runs", type=int, default=3, help="runs per path and size (default 3)")
    parser.add_argument("--lead", type=float, default=3.0, help="seconds the launch arrives before its window")
    args = parser.parse_args()

    import docker

    from nodeagent import schema
    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image
    from tests import registry_support
    from tests.runtime.image_support import remove_repository, sized_image

    client = docker.from_env(timeout=300)
    ensure_busybox_image(client, DEFAULT_TAG)
    work = Path(tempfile.mkdtemp(prefix="bench-images-"))
    registry = registry_support.start_registry(work / "registry", {USER: PASSWORD})
    auth = schema.RegistryAuth(registry=registry.host, username=USER, password=PASSWORD)
    began = time.monotonic()
    rows: list[tuple[str, list[float]]] = []
    goals: list[tuple[int, float, float]] = []
    try:
        for size in [int(item) for item in args.sizes.split(",") if item.strip()]:
            repository = f"bench/image-{size}mb-{uuid.uuid4().hex[:6]}"
            local = sized_image(client, DEFAULT_TAG, f"gpucp-bench-src-{uuid.uuid4().hex[:8]}:v1", size * 1000 * 1000)
            registry.push(client, local, repository, "v1", user=USER)
            drop(client, local)
            image = f"{registry.host}/{repository}:v1"
            print(f"{size} MB: pushed {image} ({time.monotonic() - began:.0f} s)", flush=True)
            measured: dict[str, list[float]] = {"prepulled": [], "at_opening": [], "bare_pull_run": [], "bare_run": []}
            for _ in range(args.runs):
                drop(client, image)
                measured["at_opening"].append(agent_run(client, image, auth, prepull=False, lead=0, state=work))
                drop(client, image)
                measured["prepulled"].append(agent_run(client, image, auth, prepull=True, lead=args.lead, state=work))
                drop(client, image)
                measured["bare_pull_run"].append(bare_run(client, image, registry.auth(USER)))
                measured["bare_run"].append(bare_run(client, image, None))
            remove_repository(client, f"{registry.host}/{repository}")
            rows += [
                (f"{size} MB  agent, pre-pulled (window -> running)", measured["prepulled"]),
                (f"{size} MB  agent, pulled at opening", measured["at_opening"]),
                (f"{size} MB  bare docker pull + docker run", measured["bare_pull_run"]),
                (f"{size} MB  bare docker run (image present)", measured["bare_run"]),
            ]
            goals.append((size, pct(measured["prepulled"], 0.95), pct(measured["bare_run"], 0.95) + 0.5))
    finally:
        registry.stop()
    print(f"\n{args.runs} runs per path; {time.monotonic() - began:.0f} s")
    print(f"{'path':<52}{'n':>5}{'p50 s':>9}{'p95 s':>9}{'max s':>9}")
    for name, values in rows:
        print(f"{name:<52}{len(values):>5}{pct(values, 0.5):>9.3f}{pct(values, 0.95):>9.3f}{max(values):>9.3f}")
    for size, p95, target in goals:
        verdict = "met" if p95 <= target else "MISSED"
        print(f"{size} MB goal: pre-pulled p95 <= bare run p95 + 0.5 s = {target:.3f} s: {verdict} ({p95:.3f} s)")


if __name__ == "__main__":
    main()
