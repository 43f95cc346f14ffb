"""AMD GPUs read through the AMD SMI Python library (``amdsmi``, shipped with ROCm), behind the same interface as
NVML.

Every field is read on its own, as in the NVML backend: an ``AmdSmiException`` on one call (a field the GPU or
driver does not support, a value the library reports as "N/A") makes that field null and never loses the rest
of the sample. The ``amdsmi`` module is passed in, so tests hand it a fake and the real one runs unchanged.

Sample fields: where a DCGM field means the same thing it keeps its DCGM name, so health rules, minute rollups
and charts work unchanged (docs/agent.md, "ROCm", has the table): GFX activity is ``DCGM_FI_DEV_GPU_UTIL``,
uncorrectable ECC/RAS errors ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``, the edge temperature ``DCGM_FI_DEV_GPU_TEMP``.
Readings with no DCGM equivalent use the names of AMD's device-metrics-exporter (``GPU_JUNCTION_TEMPERATURE``,
``GPU_MEMORY_TEMPERATURE``, ``GPU_ECC_DEFERRED_TOTAL``).
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from types import ModuleType
from typing import Any, Literal

from nodeagent import schema
from nodeagent.backends.base import BackendUnavailable, note_unsupported
from nodeagent.mig import MigResult

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# AMD device-metrics-exporter names for readings DCGM has no field for.
JUNCTION_TEMP = "GPU_JUNCTION_TEMPERATURE"  # degrees C, the hotspot
MEMORY_TEMP = "GPU_MEMORY_TEMPERATURE"  # degrees C, HBM
ECC_DEFERRED = "GPU_ECC_DEFERRED_TOTAL"


class AmdsmiBackend:
    """Reads AMD GPUs through amdsmi. ``amdsmi`` defaults to ``import amdsmi``."""

    name: Literal["amdsmi"] = "amdsmi"
    simulated = False
    # amdsmi has an event API for some RAS events, but not one the agent can poll without a thread per GPU;
    # uncorrectable errors still reach the control plane through the ECC counters in every sample.
    events_supported = False
    events_detail: str | None = "XID events are NVIDIA's; on AMD, RAS errors are read as ECC counters"
    cuda_version: str | None = None

    def __init__(self, *, amdsmi: ModuleType | Any | None = None) -> None:
        if amdsmi is None:
            try:
                import amdsmi as module  # type: ignore[import-not-found]
            except ImportError as exc:
                raise BackendUnavailable(
                    f"the amdsmi module is not installed ({exc}): install ROCm's amdsmi Python package, or use "
                    "--simulate SPEC (e.g. --simulate 8xMI300X)"
                ) from exc
            amdsmi = module
        self._smi: Any = amdsmi
        try:
            amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except amdsmi.AmdSmiException as exc:
            raise BackendUnavailable(
                f"amdsmi is not available on this machine ({exc}): is the amdgpu driver loaded?"
            ) from exc
        self._handles: dict[str, Any] = {}
        self.unsupported: dict[str, set[str]] = {}
        self.driver_version: str | None = None

    # -- reading helpers ------------------------------------------------------------------------------------

    def _read(self, uuid: str, field: str, function: str, *args: Any) -> Any:
        fn = getattr(self._smi, function, None)
        if fn is None:
            self._note(uuid, field, f"{function} is not in this amdsmi")
            return None
        try:
            return fn(*args)
        except self._smi.AmdSmiException as exc:
            self._note(uuid, field, str(exc))
            return None

    def _note(self, uuid: str, field: str, why: str) -> None:
        note_unsupported(self.unsupported, uuid, field, why)

    # -- discovery ------------------------------------------------------------------------------------------

    def discover(self) -> list[schema.GpuFacts]:
        smi = self._smi
        try:
            handles = list(smi.amdsmi_get_processor_handles())
        except smi.AmdSmiException as exc:
            log.warning("amdsmi cannot list GPUs: %s", exc)
            return []
        found: list[tuple[int, str, Any]] = []
        for index, handle in enumerate(handles):
            try:
                uuid = str(smi.amdsmi_get_gpu_device_uuid(handle))
            except smi.AmdSmiException as exc:
                log.warning("GPU at index %d is unreadable: %s", index, exc)
                continue
            # The control plane's uuids are ASCII words; amdsmi's are hex with dashes already.
            found.append((index, uuid if uuid.upper().startswith("GPU-") else f"GPU-{uuid}", handle))
        self._handles = {uuid: handle for _, uuid, handle in found}
        if self.driver_version is None and found:
            driver = self._read(found[0][1], "driver", "amdsmi_get_gpu_driver_info", found[0][2])
            self.driver_version = _text(driver.get("driver_version")) if isinstance(driver, dict) else None

        facts = []
        for index, uuid, handle in found:
            asic = self._read(uuid, "asic", "amdsmi_get_gpu_asic_info", handle) or {}
            name = _text(asic.get("market_name")) or "Unknown AMD GPU"
            vram = self._read(uuid, "vram", "amdsmi_get_gpu_vram_usage", handle) or {}
            total = _number(vram.get("vram_total"))  # MB
            bdf = self._read(uuid, "pci_bus_id", "amdsmi_get_gpu_device_bdf", handle)
            numa = self._read(uuid, "numa_node", "amdsmi_topo_get_numa_node_number", handle)
            peers = [
                other for _, other, other_handle in found if other != uuid and self._xgmi(uuid, handle, other_handle)
            ]
            facts.append(
                schema.GpuFacts(
                    uuid=uuid,
                    index=index,
                    name=name[:128],
                    memory_total_mib=int(total) if total is not None else 0,
                    pci_bus_id=_text(bdf) or None,
                    numa_node=int(numa) if isinstance(numa, int) and numa >= -1 else None,
                    nvlink_peers=peers,
                    serial=_text(asic.get("asic_serial")) or None,
                    vendor="amd",
                )
            )
        return facts

    def _xgmi(self, uuid: str, handle: Any, other: Any) -> bool:
        link = self._read(uuid, "xgmi", "amdsmi_topo_get_link_type", handle, other)
        if not isinstance(link, dict):
            return False
        kind = link.get("type")
        xgmi = getattr(getattr(self._smi, "AmdSmiIoLinkType", None), "XGMI", None)
        return kind == xgmi and (link.get("hops") in (None, 1))

    # -- samples --------------------------------------------------------------------------------------------

    def sample(self, now: datetime) -> list[schema.GpuSample]:
        if not self._handles:
            self.discover()
        samples = []
        for uuid, handle in self._handles.items():
            fields = self._read_fields(uuid, handle)
            fields = {k: v if v is None or math.isfinite(v) else None for k, v in fields.items()}
            samples.append(schema.GpuSample(uuid=uuid, ts=now, fields=fields))
        return samples

    def _read_fields(self, uuid: str, h: Any) -> dict[str, float | None]:
        smi = self._smi
        read = self._read
        f: dict[str, float | None] = {
            schema.GPU_UTIL: None,
            schema.MEM_COPY_UTIL: None,
            schema.FB_USED: None,
            schema.FB_TOTAL: None,
            schema.GPU_TEMP: None,
            JUNCTION_TEMP: None,
            MEMORY_TEMP: None,
            schema.POWER_USAGE: None,
            schema.TOTAL_ENERGY: None,
            schema.SM_CLOCK: None,
            schema.ECC_SBE_VOL: None,
            schema.ECC_DBE_VOL: None,
            ECC_DEFERRED: None,
        }
        activity = read(uuid, "activity", "amdsmi_get_gpu_activity", h)
        if isinstance(activity, dict):
            f[schema.GPU_UTIL] = _number(activity.get("gfx_activity"))
            f[schema.MEM_COPY_UTIL] = _number(activity.get("umc_activity"))
        vram = read(uuid, "vram", "amdsmi_get_gpu_vram_usage", h)
        if isinstance(vram, dict):
            f[schema.FB_USED], f[schema.FB_TOTAL] = _number(vram.get("vram_used")), _number(vram.get("vram_total"))
        kinds, current = smi.AmdSmiTemperatureType, smi.AmdSmiTemperatureMetric.CURRENT
        for field, sensor in ((schema.GPU_TEMP, "EDGE"), (JUNCTION_TEMP, "HOTSPOT"), (MEMORY_TEMP, "VRAM")):
            kind = getattr(kinds, sensor, None)
            if kind is not None:
                f[field] = _number(read(uuid, field, "amdsmi_get_temp_metric", h, kind, current))
        power = read(uuid, schema.POWER_USAGE, "amdsmi_get_power_info", h)
        if isinstance(power, dict):
            # Watts; MI300 reports current_socket_power, older boards only average_socket_power.
            value = _number(power.get("current_socket_power"))
            f[schema.POWER_USAGE] = value if value is not None else _number(power.get("average_socket_power"))
        energy = read(uuid, schema.TOTAL_ENERGY, "amdsmi_get_energy_count", h)
        if isinstance(energy, dict):
            count = _number(energy.get("energy_accumulator", energy.get("power")))
            resolution = _number(energy.get("counter_resolution"))  # microjoules per count
            if count is not None and resolution is not None:
                f[schema.TOTAL_ENERGY] = count * resolution / 1000.0  # mJ, as DCGM counts it
        clock = read(uuid, schema.SM_CLOCK, "amdsmi_get_clock_info", h, getattr(smi.AmdSmiClkType, "GFX", None))
        if isinstance(clock, dict):
            f[schema.SM_CLOCK] = _number(clock.get("clk"))
        ecc = read(uuid, "ecc", "amdsmi_get_gpu_total_ecc_count", h)
        if isinstance(ecc, dict):
            f[schema.ECC_SBE_VOL] = _number(ecc.get("correctable_count"))
            f[schema.ECC_DBE_VOL] = _number(ecc.get("uncorrectable_count"))
            f[ECC_DEFERRED] = _number(ecc.get("deferred_count"))
        return f

    def poll_events(self, now: datetime) -> list[schema.AgentEvent]:
        return []

    def configure_mig(self, uuid: str, *, enabled: bool, layout: list[str]) -> MigResult:
        return MigResult("refused", "MIG is NVIDIA's; AMD GPUs are not partitioned by this agent")

    def close(self) -> None:
        try:
            self._smi.amdsmi_shut_down()
        except self._smi.AmdSmiException as exc:
            log.info("amdsmi shut down with an error: %s", exc)


def _text(value: Any) -> str:
    if value is None:
        return ""
    text = value.decode() if isinstance(value, bytes) else str(value)
    return "" if text.strip().upper() == "N/A" else text.strip()


def _number(value: Any) -> float | None:
    """amdsmi writes "N/A" for a value the GPU does not have; that is unknown, like an unsupported field."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None
