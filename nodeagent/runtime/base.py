"""The contract between the agent loop and a container runtime. Kept small: the Docker runtime implements it."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from nodeagent import schema


@runtime_checkable
class ContainerRuntime(Protocol):
    """Runs the containers the control plane wants on this node, converging on every heartbeat reply."""

    def reconcile(self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime) -> None:
        """Make what runs match ``desired``; stop the launch ids in ``stop`` and anything no longer desired.

        Called with the same desired list again and again: a launch that already runs is left alone.
        """
        ...

    def report(self) -> list[schema.ContainerReport]:
        """Every container this runtime runs or ran for a launch the control plane has not forgotten."""
        ...

    def facts(self) -> schema.ContainerRuntimeFacts: ...

    def busy_gpus(self) -> set[str]:
        """UUIDs of the GPUs bound to a running container now."""
        ...

    def fence(self, now: datetime, reason: str, *, replaceable_only: bool = False) -> None:
        """No reply from the control plane for the lease: stop every running container (notice, SIGTERM, SIGKILL
        after its grace), report each as ``fenced`` with ``reason``, and start nothing until ``unfence``.

        ``replaceable_only``: only the launches the control plane would place elsewhere (``replaceable``); the
        others run on, and the runtime goes on converging them (starts, warnings, stops at their window's end).
        A later call without it fences the rest too."""
        ...

    def unfence(self) -> None:
        """The control plane answered again; what runs is the desired state's to say once more."""
        ...

    def next_kill_at(self) -> datetime | None:
        """When a container being stopped is next due its SIGKILL, so the agent reconciles then without a reply."""
        ...


class NullRuntime:
    """No container engine on this node (``--runtime none``).

    A launch it is asked for is reported as failed, with the reason, rather than silently never starting.
    """

    def __init__(self) -> None:
        self._refused: dict[str, schema.ContainerReport] = {}

    def reconcile(self, desired: list[schema.DesiredContainer], stop: list[str], now: datetime) -> None:
        wanted = {d.launch_id: d for d in desired if d.launch_id not in stop}
        self._refused = {launch_id: r for launch_id, r in self._refused.items() if launch_id in wanted}
        for launch_id, d in wanted.items():
            self._refused.setdefault(
                launch_id,
                schema.ContainerReport(
                    launch_id=launch_id,
                    reservation=d.reservation,
                    state="failed",
                    gpu_uuids=list(d.gpu_uuids),
                    finished_at=now,
                    error="this node agent runs without a container runtime (--runtime none)",
                ),
            )

    def report(self) -> list[schema.ContainerReport]:
        return list(self._refused.values())

    def facts(self) -> schema.ContainerRuntimeFacts:
        return schema.ContainerRuntimeFacts(kind="none", gpu_mode="none", detail="no container runtime configured")

    def busy_gpus(self) -> set[str]:
        return set()

    def fence(self, now: datetime, reason: str, *, replaceable_only: bool = False) -> None:
        """Nothing runs here, so nothing needs stopping."""

    def unfence(self) -> None:
        pass

    def next_kill_at(self) -> datetime | None:
        return None
