"""The log-follow part of bench/access.py, in a process of its own (it sets Django up on a fresh database).

    .venv/bin/python bench/access_logs.py [--lines 40]     prints one JSON line: {"lag_s", "engine_lag_s"}

The control plane runs here (Django's threaded server on a free port, DATABASE_URL or
postgres://postgres@127.0.0.1:5432/bench_access, dropped and created afresh), with a real agent (Agent +
DockerRuntime + LogShipper, simulated GPUs) in a thread. The demo tenant books one GPU for a container that
writes a line every 0.5 s holding the host's uptime (``/proc/uptime``: the container shares the host's clock
and sees it with 10 ms resolution). A follower reads ``GET /reservations/{id}/logs/?follow=1`` (Server-Sent
Events) with a token, as `gpucp logs -f` does, and notes the uptime when each line arrives. The baseline,
in the same run: the same lines read from the engine directly (`docker logs -f`, the docker SDK).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import uuid
from datetime import timedelta
from pathlib import Path

from _common import fresh_database

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_access"


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=40)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    fresh_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["CELERY_TASK_ALWAYS_EAGER"] = "true"
    os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-access-"))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    import docker
    import requests
    from dispatch import start_agent, start_web, wait_until  # bench/dispatch.py: the same harness
    from django.utils import timezone

    from controlplane.accounts.models import Project
    from controlplane.accounts.services import api_token_create
    from controlplane.inventory.choices import ServerState
    from controlplane.inventory.models import GpuModel, Server
    from controlplane.reservations import services as reservations
    from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window
    from controlplane.system.management.demo import seed_demo
    from nodeagent.client import ControlPlaneClient
    from nodeagent.logship import LogShipper
    from nodeagent.runtime.containers import LABEL_NODE
    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

    client = docker.from_env(timeout=60)
    ensure_busybox_image(client, DEFAULT_TAG)
    seed_demo()
    httpd, web = start_web()
    hostname = f"bench-logs-{uuid.uuid4().hex[:6]}"
    state = Path(tempfile.mkdtemp(prefix="bench-access-agent-"))
    agent, thread, channel = start_agent(client, web, hostname, state)
    shipper = LogShipper(
        client=ControlPlaneClient(web, timeout=10), credential=lambda: agent.credential, docker_client=client,
        node=hostname,
    ).start()  # fmt: skip
    try:
        server = wait_until(
            lambda: Server.objects.filter(hostname=hostname, gpus__isnull=False).first(), 60, "enrollment"
        )
        Server.objects.filter(pk=server.pk).update(state=ServerState.READY)
        project = Project.objects.get(slug="demo")
        alice = project.memberships.get().user
        _, token = api_token_create(user=alice, name="bench")
        now = timezone.now()
        job = (
            f"i=0; while [ $i -lt {args.lines} ]; do echo \"line $i $(cut -d' ' -f1 /proc/uptime)\"; "
            "i=$((i+1)); sleep 0.5; done; sleep 3600"
        )
        r = reservations.reservation_create(
            project=project,
            name="logs",
            spec=GpuSpec(gpu_model_id=GpuModel.objects.get(name="H100-80GB").pk, gpu_count=1),
            window=Window(now, now + timedelta(minutes=10)),
            container=ContainerSpec(image=DEFAULT_TAG, command=["sh", "-c", job]),
            actor=alice,
            now=now,
        )
        # The baseline, in the same run: the same lines read straight from the engine (`docker logs -f`), on
        # the node itself, with no agent, HTTP or database between.
        engine_lags: list[float] = []

        def follow_engine() -> None:
            container = wait_until(
                lambda: next(iter(client.containers.list(filters={"label": f"{LABEL_NODE}={hostname}"})), None),
                60,
                "the container",
            )
            pending = b""
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                arrived = uptime()
                pending += chunk
                *whole, pending = pending.split(b"\n")
                for line in whole:
                    parts = line.decode(errors="replace").split()
                    if len(parts) == 3 and parts[0] == "line":
                        engine_lags.append(arrived - float(parts[2]))
                if len(engine_lags) >= args.lines:
                    return

        engine = threading.Thread(target=follow_engine, name="docker-logs-f", daemon=True)
        engine.start()
        lags: list[float] = []
        stream = requests.get(
            f"{web}/api/v1/reservations/{r.public_id}/logs/",
            params={"follow": "1"},
            headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
            stream=True,
            timeout=(10, 120),
        )
        stream.raise_for_status()
        partial = ""
        # Byte by byte, as an EventSource reads: iter_lines would wait for 512 bytes before a line.
        for raw in stream.iter_lines(chunk_size=1, decode_unicode=True):
            if not raw or not raw.startswith("data:"):
                continue
            arrived = uptime()
            partial += json.loads(raw[5:].strip()).get("text", "")
            *whole, partial = partial.split("\n")
            for line in whole:
                parts = line.split()
                if len(parts) == 3 and parts[0] == "line":
                    lags.append(arrived - float(parts[2]))
            if len(lags) >= args.lines:
                break
        stream.close()
        engine.join(timeout=30)
        print(json.dumps({"lag_s": lags, "engine_lag_s": engine_lags}), flush=True)
    finally:
        shipper.stop()
        agent.stop()
        thread.join(timeout=10)
        channel.close()
        httpd.shutdown()
        for container in client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={hostname}"}):
            container.remove(force=True)


if __name__ == "__main__":
    main()
