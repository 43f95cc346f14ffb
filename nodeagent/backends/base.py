"""The one small interface every GPU backend implements."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from nodeagent import schema
from nodeagent.mig import MigResult

log = logging.getLogger(__name__)


def note_unsupported(unsupported: dict[str, set[str]], uuid: str, field: str, why: str) -> None:
    """A field this GPU could not give: logged once per GPU and field (it is reported as null every time, and a
    log line per sample would drown the rest)."""
    seen = unsupported.setdefault(uuid, set())
    if field not in seen:
        seen.add(field)
        log.info("GPU %s: %s is unavailable (%s); it is reported as null", uuid, field, why)


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine (no NVML library, no driver). The message says what to do."""


@runtime_checkable
class GpuBackend(Protocol):
    """Where GPU facts, samples and events come from: NVML on a real server, a declared fleet in simulation."""

    # Read-only here so a backend may declare them as plain class attributes with narrower types.
    @property
    def name(self) -> Literal["nvml", "amdsmi", "simulated"]: ...

    @property
    def simulated(self) -> bool: ...

    @property
    def driver_version(self) -> str | None: ...

    @property
    def cuda_version(self) -> str | None: ...

    @property
    def events_supported(self) -> bool:
        """False when the backend cannot deliver XID events; ``events_detail`` then says why."""
        ...

    @property
    def events_detail(self) -> str | None: ...

    def discover(self) -> list[schema.GpuFacts]:
        """The GPUs present now, in index order."""
        ...

    def sample(self, now: datetime) -> list[schema.GpuSample]:
        """One reading of every GPU still present. A GPU that is gone has no sample."""
        ...

    def poll_events(self, now: datetime) -> list[schema.AgentEvent]:
        """Events since the last poll, without blocking."""
        ...

    def configure_mig(self, uuid: str, *, enabled: bool, layout: list[str]) -> MigResult:
        """Give one GPU this MIG layout (GPU instance profiles, one compute instance each); a backend or GPU
        without MIG refuses, saying why."""
        ...

    def close(self) -> None: ...
