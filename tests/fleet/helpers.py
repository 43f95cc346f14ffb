"""Builders for agent messages and enrolled servers, shared by the fleet and inventory tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from controlplane.fleet import services
from controlplane.inventory.models import GpuModel, Server
from nodeagent import schema

H100 = "NVIDIA H100 80GB HBM3"
T0 = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)


def gpu_uuid(hostname: str, index: int) -> str:
    return f"GPU-{hostname}-{index:02d}"


def gpu_facts(hostname: str, count: int = 2, product: str = H100) -> list[dict[str, Any]]:
    return [
        {
            "uuid": gpu_uuid(hostname, i),
            "index": i,
            "name": product,
            "memory_total_mib": 81559,
            "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
            "numa_node": i // 4,
        }
        for i in range(count)
    ]


def sample_fields(**overrides: float | None) -> dict[str, float | None]:
    fields: dict[str, float | None] = {
        schema.GPU_UTIL: 50.0,
        schema.FB_USED: 1000.0,
        schema.GPU_TEMP: 40.0,
        schema.POWER_USAGE: 300.0,
        schema.TOTAL_ENERGY: 1_000_000.0,
        schema.ECC_DBE_VOL: 0.0,
        schema.RETIRED_PENDING: 0.0,
        schema.ROW_REMAP_FAILURE: 0.0,
        schema.XID_ERRORS: 0.0,
    }
    fields.update(overrides)
    return fields


# The wire version ``heartbeat`` builds when not told; tests/fleet/conftest.py runs the fleet's tests with each.
WIRE_VERSION = schema.HEARTBEAT_SCHEMA_VERSION


def heartbeat(
    hostname: str,
    *,
    seq: int = 1,
    gpus: list[dict[str, Any]] | None = None,
    samples_per_gpu: int = 1,
    start: datetime = T0,
    fields: dict[str, dict[str, float | None]] | None = None,
    events: list[dict[str, Any]] | None = None,
    version: int | None = None,
) -> dict[str, Any]:
    """A heartbeat as the agent sends it. ``fields`` overrides sample fields per GPU uuid. ``version`` 1 is one
    object per sample (older agents); 2 is columns per GPU, built by the agent's own code."""
    gpus = gpu_facts(hostname) if gpus is None else gpus
    samples = []
    for g in gpus:
        for i in range(samples_per_gpu):
            f = sample_fields(**(fields or {}).get(g["uuid"], {}))
            samples.append({"uuid": g["uuid"], "ts": (start + timedelta(seconds=i)).isoformat(), "fields": f})
    body = {
        "schema_version": 1,
        "seq": seq,
        "sent_at": (start + timedelta(seconds=samples_per_gpu)).isoformat(),
        "node": {"hostname": hostname, "agent_version": "0.1.0", "backend": "simulated", "simulated": True},
        "gpus": gpus,
        "samples": samples,
        "events": events or [],
        "containers": [],
    }
    return to_wire(body, version)


def to_wire(body: dict[str, Any], version: int | None = None) -> dict[str, Any]:
    """A version 1 body (one object per sample, easy for a test to edit) as ``version`` sends it."""
    if (version or WIRE_VERSION) == 1:
        return body
    series = schema.series_from_samples(schema.GpuSample.model_validate(s) for s in body["samples"])
    return {**body, "schema_version": 2, "samples": [s.model_dump(mode="json") for s in series]}


def ingest(server: Server, body: dict[str, Any], now: datetime | None = None) -> schema.HeartbeatReply:
    return services.heartbeat_ingest(server=server, heartbeat=schema.parse_heartbeat(json.dumps(body)), now=now)


def enroll(hostname: str = "node-a", *, operator: Any = None) -> tuple[Server, str]:
    _, plaintext = services.join_token_create(actor=operator, note="test")
    return services.agent_enroll(join_token=plaintext, hostname=hostname, simulated=True)


def h100_model() -> GpuModel:
    return GpuModel.objects.get_or_create(
        product_name=H100, defaults={"name": "H100-80GB", "memory_mib": 81559, "price_per_gpu_hour": "2.5000"}
    )[0]
