"""The placement rule, as a pure function over plain data so it can be tested exhaustively.

Given the servers that have free GPUs matching a spec for the whole window:

* **A GPU count that fits in one server goes on one server.** "Fits" means some matching server has at
  least that many GPUs in total; if none has that many *free*, the request waits or is refused: a job split
  across servers without NVLink between them is rarely what anyone wants.
* **Best fit between servers:** among the servers that can hold the request, the one left with the fewest
  free GPUs afterwards wins, so whole servers stay whole for the large requests that come later. Ties go to
  the server where the GPUs are closest (below), then to the hostname.
* **Locality inside a server:** GPUs that share an NVLink group first (the smallest group that holds them
  all), then GPUs on one NUMA node (the smallest such node), else the fewest NUMA nodes.
* **A count larger than any server** spans servers: whole free servers from the largest down, then the
  remainder best-fit on one more server.
* **Whole servers:** servers whose every GPU matches, is healthy and is free; the smallest first, then by
  hostname.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

LOCAL_NVLINK = 2
LOCAL_NUMA = 1
LOCAL_NONE = 0


@dataclass(frozen=True)
class GpuSlot:
    id: int
    index: int
    numa_node: int | None = None
    nvlink_peers: frozenset[int] = field(default_factory=frozenset)  # ids of GPUs on the same server


@dataclass(frozen=True)
class ServerCandidate:
    id: int
    hostname: str
    total: int  # GPUs on this server that match the spec, free or not
    free: tuple[GpuSlot, ...]  # matching, healthy GPUs free for the whole window
    whole: bool = False  # every GPU of the server matches, is healthy and is free


def _components(free: Sequence[GpuSlot]) -> list[list[GpuSlot]]:
    """NVLink-connected groups among the free GPUs (a link to a busy GPU does not count)."""
    by_id = {gpu.id: gpu for gpu in free}
    seen: set[int] = set()
    groups: list[list[GpuSlot]] = []
    for gpu in sorted(free, key=lambda g: g.index):
        if gpu.id in seen:
            continue
        stack, group = [gpu], []
        seen.add(gpu.id)
        while stack:
            current = stack.pop()
            group.append(current)
            for peer in current.nvlink_peers:
                if peer in by_id and peer not in seen:
                    seen.add(peer)
                    stack.append(by_id[peer])
        groups.append(sorted(group, key=lambda g: g.index))
    return groups


def pick_in_server(free: Sequence[GpuSlot], count: int) -> tuple[list[GpuSlot], int]:
    """Choose ``count`` of a server's free GPUs, closest together first. Returns the GPUs and the locality."""
    if count > len(free):
        raise ValueError("not enough free GPUs on this server")
    if count == 1:
        # One GPU is local by definition; take the one whose absence breaks the fewest groups.
        singles = [g for g in _components(free) if len(g) == 1]
        best = singles[0] if singles else min(_components(free), key=len)
        return [best[0]], LOCAL_NVLINK
    linked = [group for group in _components(free) if len(group) >= count and len(group) > 1]
    if linked:
        group = min(linked, key=lambda g: (len(g), g[0].index))
        return group[:count], LOCAL_NVLINK
    by_numa: dict[int | None, list[GpuSlot]] = defaultdict(list)
    for gpu in sorted(free, key=lambda g: g.index):
        by_numa[gpu.numa_node].append(gpu)
    fitting = [group for node, group in by_numa.items() if node is not None and len(group) >= count]
    if fitting:
        group = min(fitting, key=lambda g: (len(g), g[0].index))
        return group[:count], LOCAL_NUMA
    chosen: list[GpuSlot] = []
    for group in sorted(by_numa.values(), key=lambda g: (-len(g), g[0].index)):
        chosen.extend(group[: count - len(chosen)])
        if len(chosen) == count:
            break
    return chosen, LOCAL_NONE


def place_count(servers: Sequence[ServerCandidate], count: int) -> list[int] | None:
    """GPU ids for ``count`` GPUs by the rule above, or None when the fleet cannot hold them now."""
    if count < 1:
        raise ValueError("count must be at least 1")
    largest = max((s.total for s in servers), default=0)
    if count <= largest:
        best: tuple[tuple[int, int, str], list[GpuSlot]] | None = None
        for server in servers:
            if len(server.free) < count:
                continue
            chosen, locality = pick_in_server(server.free, count)
            key = (len(server.free) - count, -locality, server.hostname)
            if best is None or key < best[0]:
                best = (key, chosen)
        return [gpu.id for gpu in best[1]] if best else None
    if sum(len(s.free) for s in servers) < count:
        return None
    remaining = sorted((s for s in servers if s.free), key=lambda s: (-len(s.free), s.hostname))
    chosen_ids: list[int] = []
    while len(chosen_ids) < count:
        need = count - len(chosen_ids)
        fits = [s for s in remaining if len(s.free) >= need]
        if fits:
            server = min(fits, key=lambda s: (len(s.free), s.hostname))
            chosen_ids.extend(gpu.id for gpu in pick_in_server(server.free, need)[0])
            break
        server = remaining.pop(0)
        chosen_ids.extend(gpu.id for gpu in server.free)
    return chosen_ids


def place_whole_servers(servers: Sequence[ServerCandidate], count: int) -> list[int] | None:
    if count < 1:
        raise ValueError("count must be at least 1")
    whole = sorted((s for s in servers if s.whole and s.free), key=lambda s: (len(s.free), s.hostname))
    if len(whole) < count:
        return None
    return [gpu.id for server in whole[:count] for gpu in server.free]


def place(
    servers: Sequence[ServerCandidate], *, gpu_count: int | None = None, whole_servers: int | None = None
) -> list[int] | None:
    if whole_servers is not None:
        return place_whole_servers(servers, whole_servers)
    assert gpu_count is not None
    return place_count(servers, gpu_count)


def coverage(intervals: Sequence[tuple[float, float]], k: int) -> list[tuple[float, float]]:
    """The closed stretches where at least ``k`` of the closed ``intervals`` overlap, in order."""
    if k < 1 or len(intervals) < k:
        return []
    events: list[tuple[float, int]] = []
    for a, b in intervals:
        if b >= a:
            events.append((a, 0))  # starts sort before ends at the same instant: the intervals are closed
            events.append((b, 1))
    events.sort()
    out: list[tuple[float, float]] = []
    depth = 0
    opened = 0.0
    for at, kind in events:
        if kind == 0:
            depth += 1
            if depth == k:
                opened = at
        else:
            if depth == k:
                out.append((opened, at))
            depth -= 1
    return out
