"""One collector per source, each with ``collect()``: the GPUs, the host, and GPU events.

Sources (the GPU backend, the filesystem root) are passed in, so tests hand them fakes.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from nodeagent import schema
from nodeagent.backends.base import GpuBackend

log = logging.getLogger(__name__)


@dataclass
class GpuReading:
    samples: list[schema.GpuSample]
    events: list[schema.AgentEvent] = field(default_factory=list)


class GpuCollector:
    """Samples the backend's GPUs and notices when a known GPU stops answering (a ``gpu_lost`` event).

    Discovery is cached and refreshed every ``rediscover_s`` seconds (by the sample timestamps), because
    walking every NVLink of every GPU is too slow to do every second.
    """

    def __init__(self, backend: GpuBackend, *, rediscover_s: float = 60.0) -> None:
        self.backend = backend
        self.rediscover_s = rediscover_s
        self._facts: list[schema.GpuFacts] | None = None
        self._discovered_at: datetime | None = None
        self._known: dict[str, schema.GpuFacts] = {}
        self._lost: set[str] = set()

    def facts(self, now: datetime) -> list[schema.GpuFacts]:
        stale = self._discovered_at is None or (now - self._discovered_at).total_seconds() >= self.rediscover_s
        if self._facts is None or stale:
            self._facts = self.backend.discover()
            self._discovered_at = now
            for gpu in self._facts:
                self._known[gpu.uuid] = gpu
        return list(self._facts)

    def rediscover(self) -> None:
        """Discover again on the next reading (after a MIG reconfiguration changed the devices)."""
        self._discovered_at = None

    def numa_node(self, uuid: str) -> int | None:
        gpu = self._known.get(uuid)
        return gpu.numa_node if gpu is not None else None

    def collect(self, now: datetime) -> GpuReading:
        self.facts(now)
        samples = self.backend.sample(now)
        seen = {s.uuid for s in samples}
        if seen - set(self._known):
            self._discovered_at = None  # a GPU nobody discovered yet: list it on the next heartbeat
        events: list[schema.AgentEvent] = []
        for uuid, gpu in self._known.items():
            if uuid not in seen and uuid not in self._lost:
                self._lost.add(uuid)
                events.append(
                    schema.AgentEvent(
                        kind="gpu_lost",
                        ts=now,
                        uuid=uuid,
                        message=f"GPU {gpu.index} ({gpu.name}, {gpu.pci_bus_id or 'no PCI id'}) stopped answering",
                    )
                )
                # Rediscover at once, so the next heartbeat's GPU list no longer offers it.
                self._discovered_at = None
            elif uuid in seen and uuid in self._lost:
                self._lost.discard(uuid)
                self._discovered_at = None
                events.append(
                    schema.AgentEvent(kind="agent", ts=now, uuid=uuid, message=f"GPU {gpu.index} answers again")
                )
        return GpuReading(samples=samples, events=events)


class EventCollector:
    """GPU events (XIDs) from the backend. Says once, as an ``agent`` event, when the backend cannot deliver them."""

    def __init__(self, backend: GpuBackend) -> None:
        self.backend = backend
        self._said_unsupported = False

    def collect(self, now: datetime) -> list[schema.AgentEvent]:
        events = self.backend.poll_events(now)
        if not self.backend.events_supported and not self._said_unsupported:
            self._said_unsupported = True
            events.append(
                schema.AgentEvent(
                    kind="agent", ts=now, message=self.backend.events_detail or "XID events are not collected"
                )
            )
        return events


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    cpu_count: int | None
    memory_bytes: int | None
    numa_cpus: dict[str, str]


class HostCollector:
    """Hostname, CPUs, memory and each NUMA node's CPU list, read from ``/proc`` and ``/sys`` under ``root``."""

    def __init__(self, *, root: str | Path = "/", hostname: str | None = None) -> None:
        self.root = Path(root)
        self.hostname = hostname

    def collect(self) -> HostFacts:
        return HostFacts(
            hostname=self.hostname or socket.gethostname(),
            cpu_count=os.cpu_count(),
            memory_bytes=self._memory_bytes(),
            numa_cpus=self._numa_cpus(),
        )

    def _memory_bytes(self) -> int | None:
        try:
            for line in (self.root / "proc" / "meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB meaning KiB
        except (OSError, ValueError, IndexError):
            log.debug("no memory total in %s", self.root / "proc" / "meminfo")
        return None

    def _numa_cpus(self) -> dict[str, str]:
        nodes = self.root / "sys" / "devices" / "system" / "node"
        out: dict[str, str] = {}
        try:
            entries = sorted(nodes.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
        except OSError:
            return out
        for node in entries:
            try:
                cpus = (node / "cpulist").read_text().strip()
            except OSError:
                continue
            if cpus:
                out[node.name[4:]] = cpus[:256]
        return out
