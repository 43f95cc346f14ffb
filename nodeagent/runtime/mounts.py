"""What a launch mounts and which network it joins, checked before its container is created.

A refusal here is final (``LaunchRefused``): no retry makes a missing dataset appear, shrinks a volume that
is over its limit, or creates the operator's network, so the launch is reported ``failed`` with the reason.
See docs/runtime.md, "Volumes" and "Network".
"""

from __future__ import annotations

import re
from pathlib import Path

import docker
from docker.errors import NotFound
from docker.types import Mount

from nodeagent import schema
from nodeagent.volumes import VolumeRefused, VolumeStore

MOUNTINFO = Path("/proc/self/mountinfo")
# Docker's own networks that would give a container the host's network stack or none at all.
REFUSED_NETWORK_DRIVERS = frozenset({"host", "null"})
_OCTAL = re.compile(r"\\([0-7]{3})")


class LaunchRefused(Exception):
    """The launch cannot run on this node as asked; the message says why, for the tenant and the operator."""


def mounts_for(
    spec: schema.DesiredContainer, volumes: VolumeStore | None, *, mountinfo: Path = MOUNTINFO
) -> list[Mount]:
    """Bind mounts for the launch's volumes and datasets: datasets and ``read_only`` volumes read-only, and
    never a propagation that would let the container's mounts reach the host."""
    if not spec.volumes:
        return []
    if volumes is None:
        raise LaunchRefused(
            "this node has no volume root (the agent's --volume-root), so it cannot mount volumes or datasets"
        )
    try:
        prepared = volumes.prepare(spec.volumes)
    except VolumeRefused as exc:
        raise LaunchRefused(str(exc)) from None
    table = read_mountinfo(mountinfo)
    return [
        Mount(
            target=item.target,
            source=str(item.source),
            type="bind",
            read_only=item.read_only,
            propagation=propagation_for(item.source, table),
        )
        for item in prepared
    ]


def read_mountinfo(path: Path = MOUNTINFO) -> list[tuple[str, list[str]]]:
    """(mount point, optional fields) per line of a ``/proc/<pid>/mountinfo``; empty when it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return []
    table: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < 7:
            continue
        # The octal escapes are the kernel's for spaces and the like in a mount point.
        point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        table.append((point, fields[6 : fields.index("-")]))
    return table


def propagation_for(source: Path, table: list[tuple[str, list[str]]]) -> str:
    """``rslave`` when the mount holding ``source`` is shared or a slave (as systemd mounts are), so a file
    system the operator mounts inside a dataset later shows in running containers too; ``rprivate`` otherwise,
    because the engine refuses ``rslave`` on a private mount. Never ``shared``: a container's mounts must not
    reach the host."""
    best: tuple[int, list[str]] | None = None
    text = str(source)
    for point, optional in table:
        inside = text == point or text.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), optional)
    if best is not None and any(tag.startswith(("shared:", "master:")) for tag in best[1]):
        return "rslave"
    return "rprivate"


def network_for(spec: schema.DesiredContainer, client: docker.DockerClient, default: str) -> str:
    """The container's ``network_mode``: ``default`` (loopback only) unless the launch asks for egress on the
    network the operator named, which must exist in this engine and must not be the host's."""
    if spec.network == "none":
        return default
    name = spec.network_name
    assert name  # DesiredContainer's validator: an egress container names its network
    try:
        network = client.networks.get(name)
    except NotFound:
        raise LaunchRefused(
            f"the egress network {name} does not exist on this node's Docker engine; "
            f"an operator creates it (docker network create {name})"
        ) from None
    driver = str((network.attrs or {}).get("Driver") or "")
    if driver in REFUSED_NETWORK_DRIVERS or name in ("host", "none"):
        raise LaunchRefused(f"the network {name} (driver {driver or 'unknown'}) cannot be a project's egress network")
    return str(network.name or name)
