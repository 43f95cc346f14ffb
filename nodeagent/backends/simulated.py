"""A declared fleet of simulated GPUs, for the demo and the tests. Always labelled simulated.

A spec such as ``8xH100-80GB`` gives the GPUs, ``2xA100-80GB:mig=3g.40gb+2g.20gb+2x1g.10gb`` the same with MIG
on and that layout on every GPU (``:mig=`` alone: MIG on, no instances yet). MIG follows NVIDIA's profile
tables (``nodeagent.mig``) for A100-40GB, A100-80GB and H100-80GB; AMD models (MI250X, MI300X) report
vendor "amd" and XGMI peers. UUIDs derive from the hostname and index, so a restarted agent
reports the same GPUs. Telemetry is plausible rather than random: utilization moves (towards busy when the
runtime runs a container on the GPU), power follows utilization, the energy counter integrates power and the
temperature follows power with a lag. Faults (XID, ECC double-bit error, overheating, a GPU that falls off the
bus) are injected by tests and the demo.
"""

from __future__ import annotations

import random
import re
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from nodeagent import schema
from nodeagent.mig import PROFILES, LayoutError, MigResult, parse_layout, place
from nodeagent.xid import xid_event

_NAMESPACE = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, "simulated.nodeagent.gpu-control-plane")
# Bus numbers of the eight GPUs on an HGX baseboard, so simulated PCI ids look like a real server's.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_THROTTLE_IDLE = 0x1
_THROTTLE_THERMAL = 0x20 | 0x40  # software and hardware thermal slowdown
AMBIENT_C = 30.0


@dataclass(frozen=True)
class GpuModel:
    key: str
    product_name: str  # as NVML names it
    memory_mib: int
    tdp_w: float
    idle_w: float
    max_sm_clock_mhz: int
    nvlink: bool  # NVLink on NVIDIA, XGMI on AMD: every GPU of the server is a peer
    vendor: schema.Vendor = "nvidia"


CATALOG: dict[str, GpuModel] = {
    m.key.upper(): m
    for m in (
        GpuModel("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 700.0, 70.0, 1980, True),
        GpuModel("H200-141GB", "NVIDIA H200", 143771, 700.0, 75.0, 1980, True),
        GpuModel("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 400.0, 55.0, 1410, True),
        GpuModel("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, 400.0, 60.0, 1410, True),
        GpuModel("L40S", "NVIDIA L40S", 46068, 350.0, 35.0, 2520, False),
        # As amdsmi names them (amdsmi_get_gpu_asic_info market_name); an MI250X shows as two devices (GCDs).
        GpuModel("MI250X", "AMD Instinct MI250X", 65536, 500.0, 90.0, 1700, True, "amd"),
        GpuModel("MI300X", "AMD Instinct MI300X", 196592, 750.0, 120.0, 2100, True, "amd"),
    )
}

_SPEC = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9][A-Za-z0-9-]*)\s*(?::\s*mig=([0-9a-z.+x,]*))?\s*$")


class SimulatedSpecError(ValueError):
    """A fleet spec that cannot be read; the message names what was wrong."""


@dataclass(frozen=True)
class FleetSpec:
    count: int
    model: GpuModel
    # None: MIG off. A tuple (maybe empty): MIG on with these GPU instance profiles on every GPU.
    mig: tuple[str, ...] | None = None

    def __str__(self) -> str:
        mig = "" if self.mig is None else ":mig=" + "+".join(self.mig)
        return f"{self.count}x{self.model.key}{mig}"


def parse_spec(spec: str) -> FleetSpec:
    """Read ``COUNTxMODEL`` (``8xH100-80GB``); a bare model means one GPU."""
    match = _SPEC.match(spec or "")
    if not match:
        raise SimulatedSpecError(f"simulated fleet spec {spec!r} is not COUNTxMODEL, for example 8xH100-80GB")
    count = int(match.group(1)) if match.group(1) is not None else 1
    if not 1 <= count <= schema.MAX_GPUS:
        raise SimulatedSpecError(
            f"simulated fleet spec {spec!r}: the GPU count must be between 1 and {schema.MAX_GPUS}, got {count}"
        )
    model = CATALOG.get(match.group(2).upper())
    if model is None:
        known = ", ".join(m.key for m in CATALOG.values())
        raise SimulatedSpecError(f"simulated fleet spec {spec!r}: unknown GPU model {match.group(2)!r}; known: {known}")
    mig: tuple[str, ...] | None = None
    if match.group(3) is not None:
        profiles = PROFILES.get(model.key)
        if profiles is None:
            raise SimulatedSpecError(
                f"simulated fleet spec {spec!r}: {model.key} has no MIG; MIG models: {', '.join(PROFILES)}"
            )
        mig = tuple(parse_layout(match.group(3)))
        try:
            place(profiles, mig)
        except LayoutError as exc:
            raise SimulatedSpecError(f"simulated fleet spec {spec!r}: {exc}") from exc
    return FleetSpec(count=count, model=model, mig=mig)


def simulated_uuid(hostname: str, index: int) -> str:
    return "GPU-" + str(uuidlib.uuid5(_NAMESPACE, f"{hostname}/{index}"))


@dataclass
class _Gpu:
    facts: schema.GpuFacts
    rng: random.Random
    util: float = 0.0
    power_w: float = 0.0
    temp_c: float = AMBIENT_C + 5
    energy_mj: float = 0.0
    last: datetime | None = None
    present: bool = True
    overheat_c: float | None = None
    ecc_dbe_vol: int = 0
    ecc_dbe_agg: int = 0
    retired_dbe: int = 0
    last_xid: int = 0
    pending: list[int] = field(default_factory=list)
    lost_reported: bool = False
    mig: schema.MigState | None = None
    prof_rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.prof_rng = random.Random(f"prof:{self.facts.uuid}")


Fault = Literal["xid", "ecc_dbe", "overheat", "disappear"]


class SimulatedBackend:
    """Simulated GPUs from a declared spec. ``busy_source`` tells which GPU uuids run a container now."""

    name: Literal["simulated"] = "simulated"
    simulated = True
    driver_version = "simulated"
    cuda_version = "simulated"
    events_supported = True
    events_detail: str | None = None

    def __init__(
        self,
        spec: str | FleetSpec,
        *,
        hostname: str,
        seed: int | None = None,
        busy_source: Callable[[], set[str]] | None = None,
    ) -> None:
        self.spec = spec if isinstance(spec, FleetSpec) else parse_spec(spec)
        self.hostname = hostname
        self.busy_source = busy_source
        model, count = self.spec.model, self.spec.count
        uuids = [simulated_uuid(hostname, i) for i in range(count)]
        base_seed = seed if seed is not None else uuidlib.uuid5(_NAMESPACE, hostname).int & 0xFFFFFFFF
        self._gpus: list[_Gpu] = []
        for index, uuid in enumerate(uuids):
            bus = _HGX_BUSES[index] if count <= len(_HGX_BUSES) else 0x10 + index
            peers = [u for u in uuids if u != uuid] if model.nvlink else []
            facts = schema.GpuFacts(
                uuid=uuid,
                index=index,
                name=model.product_name,
                memory_total_mib=model.memory_mib,
                pci_bus_id=f"00000000:{bus:02X}:00.0",
                numa_node=0 if index < max(1, count // 2) else 1,
                nvlink_peers=peers,
                serial=f"SIM-{uuid[4:12]}",
                vendor=model.vendor,
            )
            gpu = _Gpu(facts=facts, rng=random.Random(base_seed + index))
            gpu.power_w = model.idle_w
            self._gpus.append(gpu)
            profiles = PROFILES.get(model.key)
            if profiles is not None:
                offered = {p.name: p.instances for p in profiles.values()}
                gpu.mig = schema.MigState(current=False, pending=False, profiles=offered)
                if self.spec.mig is not None:
                    self._apply_mig(gpu, list(self.spec.mig))

    # -- the interface --------------------------------------------------------------------------------------

    def discover(self) -> list[schema.GpuFacts]:
        return [g.facts.model_copy(update={"mig": g.mig}, deep=True) for g in self._gpus if g.present]

    def configure_mig(self, uuid: str, *, enabled: bool, layout: list[str]) -> MigResult:
        """As NVML would: refused when the model has no MIG or the layout does not fit its profile table."""
        try:
            g = self._find(uuid)
        except KeyError as exc:
            return MigResult("refused", str(exc.args[0]))
        if g.mig is None:
            return MigResult("refused", f"{self.spec.model.key} cannot do MIG (NVML_ERROR_NOT_SUPPORTED)")
        if not enabled:
            if layout:
                return MigResult("refused", "a layout needs MIG enabled")
            g.mig = g.mig.model_copy(update={"current": False, "pending": False, "devices": []})
            return MigResult("applied", "MIG disabled")
        try:
            self._apply_mig(g, layout)
        except LayoutError as exc:
            return MigResult("refused", f"{exc} (NVML_ERROR_INSUFFICIENT_RESOURCES)")
        return MigResult("applied", "MIG layout " + (" + ".join(layout) if layout else "empty") + " applied")

    def _apply_mig(self, g: _Gpu, layout: list[str]) -> None:
        profiles = PROFILES[self.spec.model.key]
        placed = place(profiles, layout)
        devices = []
        for gi_id, (profile, start) in enumerate(sorted(placed, key=lambda p: p[1]), start=1):
            mig_uuid = "MIG-" + str(uuidlib.uuid5(_NAMESPACE, f"{g.facts.uuid}/{start}/{profile.name}"))
            devices.append(
                schema.MigDevice(
                    uuid=mig_uuid,
                    gpu_instance_id=gi_id,
                    compute_instance_id=0,
                    profile=profile.name,
                    profile_id=profile.profile_id,
                    memory_mib=profile.memory_mib,
                    compute_slices=profile.compute_slices,
                    memory_slices=profile.memory_slices,
                    placement_start=start,
                )
            )
        assert g.mig is not None
        g.mig = g.mig.model_copy(update={"current": True, "pending": True, "devices": devices})

    def sample(self, now: datetime) -> list[schema.GpuSample]:
        busy = self.busy_source() if self.busy_source is not None else None
        return [self._step(g, now, busy) for g in self._gpus if g.present]

    def poll_events(self, now: datetime) -> list[schema.AgentEvent]:
        events: list[schema.AgentEvent] = []
        for g in self._gpus:
            events.extend(xid_event(uuid=g.facts.uuid, xid=xid, ts=now) for xid in g.pending)
            g.pending.clear()
        return events

    def close(self) -> None:
        pass

    # -- fault injection ------------------------------------------------------------------------------------

    def inject(self, gpu: int | str, fault: Fault, *, xid: int = 79, temperature_c: float = 95.0) -> None:
        """Make one GPU misbehave: an XID, an ECC double-bit error (with XID 48), overheating, or vanishing."""
        g = self._find(gpu)
        if fault == "xid":
            g.pending.append(xid)
            g.last_xid = xid
        elif fault == "ecc_dbe":
            g.ecc_dbe_vol += 1
            g.ecc_dbe_agg += 1
            g.retired_dbe += 1
            g.pending.append(48)
            g.last_xid = 48
        elif fault == "overheat":
            g.overheat_c = temperature_c
        elif fault == "disappear":
            # As when a GPU falls off the bus: XID 79, then NVML no longer lists it.
            g.pending.append(79)
            g.last_xid = 79
            g.present = False
        else:
            raise ValueError(f"unknown fault {fault!r}; one of xid, ecc_dbe, overheat, disappear")

    def heal(self, gpu: int | str) -> None:
        """Undo overheating and bring a vanished GPU back (as after a reset); error counters stay."""
        g = self._find(gpu)
        g.overheat_c = None
        g.present = True

    def _find(self, gpu: int | str) -> _Gpu:
        for g in self._gpus:
            if gpu in (g.facts.index, g.facts.uuid):
                return g
        raise KeyError(f"no simulated GPU {gpu!r} on {self.hostname}")

    # -- the physics ----------------------------------------------------------------------------------------

    def _step(self, g: _Gpu, now: datetime, busy: set[str] | None) -> schema.GpuSample:
        model = self.spec.model
        dt = max(0.0, (now - g.last).total_seconds()) if g.last is not None else 0.0
        g.last = now
        rng = g.rng
        if busy is None:
            # No runtime to ask: a random walk, so charts move in the demo.
            g.util = _clamp(g.util + rng.uniform(-15, 15), 0, 100)
        else:
            mine = {g.facts.uuid} | {d.uuid for d in (g.mig.devices if g.mig else [])}
            target = rng.uniform(85, 100) if mine & busy else rng.uniform(0, 2)
            g.util = _clamp(g.util + (target - g.util) * 0.6, 0, 100)
        # Power follows utilization between idle and TDP.
        g.power_w = min(model.tdp_w, model.idle_w + (model.tdp_w - model.idle_w) * g.util / 100 * rng.uniform(0.9, 1))
        g.energy_mj += g.power_w * dt * 1000.0
        # Temperature approaches a level set by power, with a time constant of about 30 s.
        target_c = AMBIENT_C + 45.0 * g.power_w / model.tdp_w
        if g.overheat_c is not None:
            target_c = g.overheat_c
            g.temp_c = max(g.temp_c, g.overheat_c - 2)
        g.temp_c += (target_c - g.temp_c) * min(1.0, dt / 30.0) if dt else 0.0
        throttle = 0
        if g.util < 5:
            throttle |= _THROTTLE_IDLE
        if g.temp_c >= 87:
            throttle |= _THROTTLE_THERMAL
        fb_used = 0.4 if g.util < 5 else model.memory_mib * min(0.95, 0.3 + g.util / 150)
        fields: dict[str, float | None] = {
            schema.GPU_UTIL: round(g.util),
            schema.MEM_COPY_UTIL: round(g.util * 0.6),
            schema.FB_USED: round(fb_used, 1),
            schema.FB_TOTAL: float(model.memory_mib),
            schema.GPU_TEMP: round(g.temp_c),
            schema.POWER_USAGE: round(g.power_w, 3),
            schema.TOTAL_ENERGY: float(int(g.energy_mj)),
            schema.SM_CLOCK: float(
                model.max_sm_clock_mhz
                if g.util >= 5 and throttle & _THROTTLE_THERMAL == 0
                else (345 if g.util < 5 else model.max_sm_clock_mhz * 0.7)
            ),
            schema.ECC_SBE_VOL: 0.0,
            schema.ECC_DBE_VOL: float(g.ecc_dbe_vol),
            schema.ECC_DBE_AGG: float(g.ecc_dbe_agg),
            schema.RETIRED_PENDING: 0.0,
            schema.RETIRED_DBE: float(g.retired_dbe),
            schema.ROW_REMAP_FAILURE: 0.0,
            schema.ROW_REMAP_PENDING: 0.0,
            schema.XID_ERRORS: float(g.last_xid),
            schema.CLOCK_THROTTLE_REASONS: float(throttle),
            **_profiling(g),
        }
        return schema.GpuSample(uuid=g.facts.uuid, ts=now, fields=fields)


def _profiling(g: _Gpu) -> dict[str, float | None]:
    """DCGM's profiling fields, simulated: SM activity tracks utilization a little under it (utilization counts
    a kernel resident on any SM; activity, the share of SMs with work), tensor pipes and DRAM are busy for part
    of that. A random stream of its own per GPU, so the other fields' readings are as before."""
    rng = g.prof_rng
    sm = g.util / 100 * rng.uniform(0.75, 0.95)
    return {
        schema.PROF_SM_ACTIVE: round(sm, 4),
        schema.PROF_PIPE_TENSOR_ACTIVE: round(sm * rng.uniform(0.3, 0.7), 4),
        schema.PROF_DRAM_ACTIVE: round(sm * rng.uniform(0.4, 0.8), 4),
    }


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
