"""What a container gets of the server besides its GPUs (``DesiredContainer.resources`` and ``memory_limit_mib``):
the host CPUs it is pinned to, the size of its ``/dev/shm``, its ulimits and its memory limit, as Docker create
arguments; and the words for a container the kernel killed for its memory. Pure functions; ``docker.py`` knows
which CPUs its other containers hold. See docs/runtime.md, "Resources".
"""

from __future__ import annotations

import re
import resource
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import docker

from nodeagent import schema

MIB = 1024 * 1024


def parse_cpulist(text: str) -> list[int]:
    """CPU numbers from a list as Linux writes it (``0-3,8,10-11``); sorted, without repeats. Raises ValueError."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        low, high = int(first), int(last) if dash else int(first)
        if low < 0 or high < low:
            raise ValueError(f"not a CPU range: {part!r}")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The shortest list Linux (and Docker's ``CpusetCpus``) reads back as ``cpus``: ``0-3,8``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def pick_cpus(
    count: int, *, local: Iterable[int] | None, all_cpus: Iterable[int], taken: Mapping[int, int]
) -> list[int]:
    """``count`` CPUs for one container, deterministically (the same inputs give the same CPUs).

    ``local``: the CPUs of the NUMA node(s) its GPUs sit on (None: unknown, every CPU is as good). ``taken``: how
    many other live containers are pinned to each CPU. Free local CPUs first, then free CPUs of other nodes, then
    the least shared CPUs (local before remote), lowest numbers first; never more CPUs than the host has."""
    everything = set(all_cpus)
    near = everything if local is None else set(local)
    everything |= near
    ranked = sorted(everything, key=lambda cpu: (taken.get(cpu, 0), cpu not in near, cpu))
    return sorted(ranked[: max(0, min(count, len(ranked)))])


def taken_cpus(cpusets: Iterable[str | None]) -> Counter[int]:
    """How many of the given CPU lists (other live containers' pins) name each CPU."""
    counts: Counter[int] = Counter()
    for cpuset in cpusets:
        if cpuset:
            try:
                counts.update(parse_cpulist(cpuset))
            except ValueError:
                continue
    return counts


def memory_args(memory_mib: int | None) -> dict[str, Any]:
    """The memory limit, and the same for memory plus swap: a container gets no swap beyond its limit (Docker's
    default would give it as much swap again)."""
    if not memory_mib:
        return {}
    limit = f"{memory_mib}m"
    return {"mem_limit": limit, "memswap_limit": limit}


def resource_args(resources: schema.ContainerResources | None) -> dict[str, Any]:
    """``/dev/shm`` size and ulimits; the CPUs are picked by the runtime (``pick_cpus``). Nothing without them."""
    if resources is None:
        return {}
    args: dict[str, Any] = {}
    if resources.shm_size_mib is not None:
        args["shm_size"] = resources.shm_size_mib * MIB
    if resources.ulimits:
        # One per name (the last wins, as the engine would keep only one anyway).
        by_name = {u.name: u for u in resources.ulimits}
        args["ulimits"] = [docker.types.Ulimit(name=u.name, soft=u.soft, hard=u.hard) for u in by_name.values()]
    return args


def oom_message(memory_bytes: int | None) -> str:
    """The reason a tenant reads when the kernel killed a process of the container for its memory."""
    if memory_bytes and memory_bytes > 0:
        mib = memory_bytes // MIB
        return (
            f"out of memory: a process of the container went over its memory limit of {mib} MiB and the kernel "
            f"killed it"
        )
    return "out of memory: the kernel killed a process of the container (it has no memory limit of its own)"


# The engine's words when it could not set a ulimit on the container's process (runc, "error setting rlimit type 8:
# operation not permitted"): the number is Linux's resource number.
_RLIMIT_REFUSED = re.compile(r"error setting rlimit type (\d+): operation not permitted")
_RLIMIT_NAMES = {
    resource.RLIMIT_MEMLOCK: "memlock",
    resource.RLIMIT_STACK: "stack",
    resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_NPROC: "nproc",
    resource.RLIMIT_CORE: "core",
}


def refused_ulimit(engine_message: str) -> str | None:
    """The ulimit the engine said it could not raise (a dockerd without CAP_SYS_RESOURCE), or None."""
    found = _RLIMIT_REFUSED.search(engine_message)
    return _RLIMIT_NAMES.get(int(found.group(1))) if found else None
