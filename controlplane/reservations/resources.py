"""What a container gets of its server besides its GPUs: CPU cores, host memory, /dev/shm and ulimits, by the
operator's policy (docs/reservations.md, "Resources"). One function computes it, ``container_resources``: the
desired state sends it to the agent (dispatch), and the reservation's answer and the portal show it.

The share is the GPUs held on that server over all its GPUs, counted in memory slices so a MIG slice holds its
part of a GPU: 2 of 8 GPUs is a quarter, a 1g.10gb slice (1 of 8 memory slices) on an 8-GPU server 1/64.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count
from pydantic import ValidationError

from controlplane.inventory.models import GPU_MEMORY_SLICES, Gpu
from nodeagent.schema import ContainerResources, Ulimit

MIB = 1024 * 1024
POLICIES = ("proportional", "none")


@dataclass(frozen=True)
class Policy:
    cpu: str = "proportional"
    memory: str = "proportional"
    system_cpus: int = 0
    system_memory_fraction: float = 0.1
    shm_fraction: float = 0.5
    shm_min_mib: int = 1024
    shm_max_mib: int = 65536
    shm_unknown_mib: int = 8192
    ulimits: tuple[Ulimit, ...] = ()


def parse_ulimits(text: str) -> tuple[Ulimit, ...]:
    """``"memlock=-1,stack=67108864"`` (``name=soft[:hard]``, as ``docker run --ulimit``) as Ulimits."""
    out: list[Ulimit] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, values = part.partition("=")
        soft, _, hard = values.partition(":")
        try:
            out.append(Ulimit(name=name.strip(), soft=int(soft), hard=int(hard or soft)))  # type: ignore[arg-type]
        except (ValueError, ValidationError):
            raise ImproperlyConfigured(
                f"CONTAINER_ULIMITS: {part!r} is not name=soft[:hard] with a name among memlock, stack, nofile, "
                "nproc, core and -1 or a count"
            ) from None
    return tuple(out)


def policy() -> Policy:
    """The operator's policy, from the settings (controlplane/settings.py, "Container resources")."""
    values = Policy(
        cpu=str(getattr(settings, "CONTAINER_CPU_POLICY", "proportional")),
        memory=str(getattr(settings, "CONTAINER_MEMORY_POLICY", "proportional")),
        system_cpus=int(getattr(settings, "CONTAINER_SYSTEM_CPUS", 0)),
        system_memory_fraction=float(getattr(settings, "CONTAINER_SYSTEM_MEMORY_FRACTION", 0.1)),
        shm_fraction=float(getattr(settings, "CONTAINER_SHM_FRACTION", 0.5)),
        shm_min_mib=int(getattr(settings, "CONTAINER_SHM_MIN_MIB", 1024)),
        shm_max_mib=int(getattr(settings, "CONTAINER_SHM_MAX_MIB", 65536)),
        shm_unknown_mib=int(getattr(settings, "CONTAINER_SHM_UNKNOWN_MIB", 8192)),
        ulimits=parse_ulimits(str(getattr(settings, "CONTAINER_ULIMITS", "memlock=-1,stack=67108864"))),
    )
    for name, value in (("CONTAINER_CPU_POLICY", values.cpu), ("CONTAINER_MEMORY_POLICY", values.memory)):
        if value not in POLICIES:
            raise ImproperlyConfigured(f"{name} is {value!r}: give one of {', '.join(POLICIES)}")
    if not 0 <= values.system_memory_fraction < 1:
        raise ImproperlyConfigured("CONTAINER_SYSTEM_MEMORY_FRACTION must be at least 0 and below 1")
    return values


def _known(facts: Mapping[str, Any] | None, key: str) -> int | None:
    value = (facts or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def container_resources(
    *, held_slices: int, server_gpus: int, facts: Mapping[str, Any] | None, rules: Policy | None = None
) -> tuple[ContainerResources, int | None]:
    """What a container holding ``held_slices`` GPU memory slices (8 to a whole GPU) of a server with
    ``server_gpus`` GPUs gets, given the server's facts (``cpu_count``, ``memory_bytes`` as its agent reports
    them): the agent's ``ContainerResources`` and the memory limit in MiB. Unknown facts limit nothing: no CPU
    count, no pinning; no memory size, no memory limit and a fixed /dev/shm (CONTAINER_SHM_UNKNOWN_MIB)."""
    rules = rules or policy()
    total = server_gpus * GPU_MEMORY_SLICES
    share = min(1.0, held_slices / total) if total > 0 and held_slices > 0 else None
    cpus = None
    cpu_count = _known(facts, "cpu_count")
    if rules.cpu == "proportional" and cpu_count is not None and share is not None:
        cpus = max(1, math.floor(max(0, cpu_count - rules.system_cpus) * share))
    memory_share = None
    memory_bytes = _known(facts, "memory_bytes")
    if memory_bytes is not None and share is not None:
        memory_share = max(1, math.floor(memory_bytes * (1 - rules.system_memory_fraction) * share / MIB))
    limit = memory_share if rules.memory == "proportional" else None
    if memory_share is None:
        shm = rules.shm_unknown_mib
    else:
        shm = min(max(math.floor(memory_share * rules.shm_fraction), rules.shm_min_mib), rules.shm_max_mib)
    if limit is not None:
        shm = min(shm, limit)  # /dev/shm is memory of the container's own: never more than its limit
    return ContainerResources(cpus=cpus, shm_size_mib=max(1, shm), ulimits=list(rules.ulimits)), limit


def notes(facts: Mapping[str, Any] | None, rules: Policy | None = None) -> list[str]:
    """What the answer says of a limit not set, and why."""
    rules = rules or policy()
    out = []
    if rules.cpu == "none":
        out.append("CPUs are not limited (the operator's policy).")
    elif _known(facts, "cpu_count") is None:
        out.append("The server has not reported its CPU count: the container's CPUs are not limited.")
    if _known(facts, "memory_bytes") is None:
        out.append("The server has not reported its memory: the container's memory is not limited.")
    elif rules.memory == "none":
        out.append("Memory is not limited (the operator's policy).")
    return out


def held_slices_by_server(allocations: Iterable[Any]) -> dict[int, int]:
    """Memory slices held per server id by these allocations (a whole GPU is 8)."""
    held: dict[int, int] = {}
    for a in allocations:
        held[a.server_id] = held.get(a.server_id, 0) + (a.slice_end - a.slice_start)
    return held


def server_gpu_counts(server_ids: Iterable[int]) -> dict[int, int]:
    """The present GPUs of each server, in one read."""
    ids = sorted(set(server_ids))
    if not ids:
        return {}
    rows = Gpu.objects.filter(server_id__in=ids, present=True).values("server_id").annotate(n=Count("id"))
    return {row["server_id"]: row["n"] for row in rows.order_by()}


def for_reservation(reservation: Any) -> list[dict[str, Any]]:
    """The reservation's ``container_resources``: per server, what its container gets there. Reads the
    allocations as loaded (with ``gpu__server``) and the servers' GPU counts (one read)."""
    allocations = list(reservation.allocations.all())
    live = [a for a in allocations if a.active] or allocations
    if not live:
        return []
    servers = {a.server_id: a.gpu.server for a in live}
    held = held_slices_by_server(live)
    counts = server_gpu_counts(held)
    rules = policy()
    out = []
    for server_id in sorted(held, key=lambda pk: servers[pk].hostname):
        facts = servers[server_id].facts or {}
        resources, limit = container_resources(
            held_slices=held[server_id], server_gpus=counts.get(server_id, 0), facts=facts, rules=rules
        )
        out.append(
            {
                "server": servers[server_id].hostname,
                "gpu_share": round(held[server_id] / max(1, counts.get(server_id, 0) * GPU_MEMORY_SLICES), 4),
                "cpus": resources.cpus,
                "memory_mib": limit,
                "shm_mib": resources.shm_size_mib,
                "ulimits": [u.model_dump() for u in resources.ulimits],
                "notes": notes(facts, rules),
            }
        )
    return out
