"""``nodeagent probe``: what this machine's GPUs are, as a table or as JSON.

The JSON is a ``ProbeReport``; one recorded on a real server is kept as a test fixture, so the NVML backend's
reading of real hardware is checked against the schema in every test run.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from nodeagent import schema
from nodeagent.backends.base import GpuBackend
from nodeagent.collectors import HostCollector

PROBE_VERSION = 1


class ProbeReport(schema.Strict):
    probe_version: int = PROBE_VERSION
    schema_version: int = schema.SCHEMA_VERSION
    simulated: bool
    recorded_at: datetime
    node: schema.NodeFacts
    gpus: list[schema.GpuFacts]
    samples: list[schema.GpuSample]
    events: list[schema.AgentEvent] = Field(default_factory=list)
    # uuid -> fields NVML could not read on this machine (null in the samples).
    unavailable_fields: dict[str, list[str]] = Field(default_factory=dict)


def probe(backend: GpuBackend, *, host: HostCollector, now: datetime) -> ProbeReport:
    import nodeagent

    facts = host.collect()
    gpus = backend.discover()
    samples = backend.sample(now)
    events = backend.poll_events(now)
    node = schema.NodeFacts(
        hostname=facts.hostname,
        agent_version=nodeagent.__version__,
        backend=backend.name,
        simulated=backend.simulated,
        driver_version=backend.driver_version,
        cuda_version=backend.cuda_version,
        cpu_count=facts.cpu_count,
        memory_bytes=facts.memory_bytes,
        numa_cpus=facts.numa_cpus,
    )
    unavailable = getattr(backend, "unsupported", {}) or {}
    return ProbeReport(
        simulated=backend.simulated,
        recorded_at=now,
        node=node,
        gpus=gpus,
        samples=samples,
        events=events,
        unavailable_fields={uuid: sorted(fields) for uuid, fields in unavailable.items()},
    )


def _fmt(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _mig_cell(mig: schema.MigState | None) -> str:
    if mig is None:
        return "-"
    state = "on" if mig.current else "off"
    if mig.pending != mig.current:
        state += f" (pending {'on' if mig.pending else 'off'}: reset)"
    return f"{state}, {len(mig.devices)} devices" if mig.current else state


def render_table(report: ProbeReport) -> str:
    node = report.node
    label = " (SIMULATED)" if report.simulated else ""
    lines = [
        f"{node.hostname}{label}: backend {node.backend}, driver {node.driver_version or '-'}, "
        f"CUDA {node.cuda_version or '-'}, {len(report.gpus)} GPUs",
    ]
    samples = {s.uuid: s.fields for s in report.samples}
    header = ("IDX", "VENDOR", "NAME", "UUID", "MEMORY", "PCI BUS ID", "NUMA", "PEERS", "MIG", "UTIL", "TEMP", "POWER")
    rows = [header]
    for gpu in report.gpus:
        f = samples.get(gpu.uuid, {})
        rows.append(
            (
                str(gpu.index),
                gpu.vendor,
                gpu.name,
                gpu.uuid,
                f"{gpu.memory_total_mib} MiB",
                gpu.pci_bus_id or "-",
                "-" if gpu.numa_node is None else str(gpu.numa_node),
                str(len(gpu.nvlink_peers)),
                _mig_cell(gpu.mig),
                _fmt(f.get(schema.GPU_UTIL), "%"),
                _fmt(f.get(schema.GPU_TEMP), " C"),
                _fmt(f.get(schema.POWER_USAGE), " W", 1),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for gpu in report.gpus:
        for device in gpu.mig.devices if gpu.mig else []:
            memory = "-" if device.memory_mib is None else f"{device.memory_mib} MiB"
            lines.append(f"  GPU {gpu.index} MIG {device.profile or '?'} {device.uuid} {memory}")
    for uuid, fields in report.unavailable_fields.items():
        lines.append(f"{uuid}: not available here: {', '.join(fields)}")
    if node.numa_cpus:
        lines.append("NUMA CPUs: " + "; ".join(f"node {n}: {cpus}" for n, cpus in node.numa_cpus.items()))
    return "\n".join(lines)
