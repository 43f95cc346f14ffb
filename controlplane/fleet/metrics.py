"""Prometheus exposition of the fleet, read from the database at scrape time.

One collector registered once in a private registry; each scrape runs five queries (the last two: node loss).
Beside it, two counters that each process keeps in memory, of the calls that went without Redis
(controlplane/core/cache.py and broker.py): per process, so with several web processes a scrape sees the one
that answered it.

Per-GPU series carry DCGM's names and labels (``gpu``, ``UUID``-style ``uuid``, ``modelName``,
``Hostname``-style ``hostname``) so dashboards built for dcgm-exporter work, plus ``simulated`` so simulated
GPUs are never mistaken for real ones.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.core.broker import PUBLISH_ERRORS
from controlplane.core.cache import CACHE_ERRORS
from controlplane.fleet.nodeloss import current_hold
from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, Server
from nodeagent import schema

GPU_LABELS = ["gpu", "uuid", "modelName", "hostname", "simulated"]

# (DCGM field, help); all gauges, as dcgm-exporter exposes them.
GPU_SERIES = (
    (schema.GPU_UTIL, "GPU utilization (in %)."),
    (schema.FB_USED, "Framebuffer memory used (in MiB)."),
    (schema.GPU_TEMP, "GPU temperature (in C)."),
    (schema.POWER_USAGE, "Power draw (in W)."),
    (schema.TOTAL_ENERGY, "Total energy consumption since boot (in mJ)."),
    (schema.XID_ERRORS, "Value of the last XID error encountered."),
)


class FleetCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        servers = GaugeMetricFamily("gpucp_servers", "Servers by lifecycle state.", labels=["state"])
        counts = dict(Server.objects.values_list("state").annotate(n=Count("id")).order_by())
        for state in ServerState.values:
            servers.add_metric([state], counts.get(state, 0))
        yield servers

        gpus = GaugeMetricFamily("gpucp_gpus", "GPUs by health and presence.", labels=["health", "present"])
        by_health = {
            (h, p): n for h, p, n in Gpu.objects.values_list("health", "present").annotate(n=Count("id")).order_by()
        }
        for health in GpuHealth.values:
            for present in (True, False):
                gpus.add_metric([health, str(present).lower()], by_health.get((health, present), 0))
        yield gpus

        families = {field: GaugeMetricFamily(field, help_text, labels=GPU_LABELS) for field, help_text in GPU_SERIES}
        unhealthy = GaugeMetricFamily("gpucp_gpu_unhealthy", "1 while the GPU is unhealthy.", labels=GPU_LABELS)
        rows = (
            Gpu.objects.filter(present=True)
            .order_by("server__hostname", "index")
            .values_list("index", "uuid", "model__name", "server__hostname", "server__simulated", "health", "telemetry")
        )
        for index, uuid, model_name, hostname, simulated, health, telemetry in rows.iterator(chunk_size=2000):
            labels = [str(index), uuid, model_name, hostname, str(simulated).lower()]
            unhealthy.add_metric(labels, 0 if health == GpuHealth.HEALTHY else 1)
            for field, family in families.items():
                value = (telemetry or {}).get(field)
                if value is not None:
                    family.add_metric(labels, float(value))
        yield from families.values()
        yield unhealthy
        yield from node_loss_series()


def node_loss_series() -> Iterator[Metric]:
    """Whether node-loss handling is held and why, and what the detector's last pass counted (two queries)."""
    hold = current_hold()
    held = GaugeMetricFamily(
        "gpucp_node_loss_held",
        "1 while node-loss handling is held (no server marked offline, nothing interrupted or requeued), by reason: "
        "grace (after the detector or the database was away) or disruption (most servers silent together).",
        labels=["reason"],
    )
    for reason in ("grace", "disruption"):
        held.add_metric([reason], 1 if hold.reason == reason else 0)
    yield held
    yield GaugeMetricFamily(
        "gpucp_servers_silent",
        "Live servers silent past the offline threshold at the detector's last pass.",
        value=hold.silent_servers,
    )
    yield GaugeMetricFamily(
        "gpucp_servers_live",
        "Live servers (not retired, ever heard) at the detector's last pass: what a disruption is a share of.",
        value=hold.live_servers,
    )
    if hold.last_pass_at is not None:
        yield GaugeMetricFamily(
            "gpucp_node_loss_last_pass_timestamp_seconds",
            "When node-loss detection last completed a pass (alert when it falls behind).",
            value=hold.last_pass_at.timestamp(),
        )


registry = CollectorRegistry(auto_describe=False)
registry.register(FleetCollector())
registry.register(CACHE_ERRORS)
registry.register(PUBLISH_ERRORS)
