"""GPUs read through NVML (``pynvml`` from NVIDIA's ``nvidia-ml-py``).

Every field is read on its own: a field the GPU or driver does not support (``NVMLError_NotSupported``), or
any other NVML error on one field, makes that field null and never loses the rest of the sample or the GPU.
Only ``NVMLError_GpuIsLost`` drops a GPU's sample, because then none of its readings mean anything.
The ``pynvml`` module is passed in, so tests hand it a fake and the real one runs unchanged.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from nodeagent import schema
from nodeagent.backends.base import BackendUnavailable, note_unsupported
from nodeagent.backends.gpm import GpmReader
from nodeagent.backends.nvml_mig import NvmlMig
from nodeagent.mig import MigResult
from nodeagent.xid import xid_event

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Remote NVLink ends that are NVSwitches rather than GPUs (HGX boards): every GPU on the fabric is a peer.
_NVLINK_SWITCH = 2


class _Unset:
    pass


_UNSET = _Unset()


def normalize_bus_id(bus_id: str) -> str:
    """NVML writes "00000000:18:00.0"; sysfs and lspci write "0000:18:00.0". Match on the latter."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep:
        return bus_id
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _GpuLost(Exception):
    pass


class NvmlBackend:
    """Reads real GPUs through NVML. ``nvml`` defaults to ``import pynvml``; ``sysfs_root`` to ``/sys``."""

    name: Literal["nvml"] = "nvml"
    simulated = False

    def __init__(self, *, nvml: ModuleType | Any | None = None, sysfs_root: str | Path = "/sys") -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
                raise BackendUnavailable(f"the pynvml module is not installed ({exc})") from exc
            nvml = pynvml
        self._nvml: Any = nvml
        self._sysfs = Path(sysfs_root)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise BackendUnavailable(
                f"NVML is not available on this machine ({exc}): is the NVIDIA driver installed and loaded? "
                "Use --simulate SPEC (e.g. --simulate 8xH100-80GB) to run with simulated GPUs."
            ) from exc
        self.driver_version: str | None = self._optional("nvmlSystemGetDriverVersion")
        cuda = self._optional("nvmlSystemGetCudaDriverVersion")
        self.cuda_version: str | None = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        self._handles: dict[str, Any] = {}
        self._last_xid: dict[str, int] = {}
        # Fields each GPU failed to read, so the log says so once instead of every second.
        self.unsupported: dict[str, set[str]] = {}
        self.events_supported = False
        self.events_detail: str | None = None
        self._event_set: Any = None
        self._mig = NvmlMig(nvml)
        # DCGM's profiling fields, through NVML's GPM API where the GPU has it (nodeagent/backends/gpm.py).
        self._gpm = GpmReader(nvml, note=self._note, is_lost=self._is_lost)

    def _is_lost(self, exc: Exception) -> bool:
        lost = getattr(self._nvml, "NVMLError_GpuIsLost", None)
        return lost is not None and isinstance(exc, lost)

    # -- reading helpers ------------------------------------------------------------------------------------

    def _optional(self, function: str, *args: Any) -> Any:
        """An NVML call whose failure (or absence from this pynvml) just means "not known"."""
        fn = getattr(self._nvml, function, None)
        if fn is None:
            return None
        try:
            value = fn(*args)
        except self._nvml.NVMLError:
            return None
        return value.decode() if isinstance(value, bytes) else value

    def _field(self, uuid: str, field: str, function: str, *args: Any) -> Any:
        """Call one NVML function for one field; None when the driver or GPU cannot answer it."""
        fn = getattr(self._nvml, function, None)
        if fn is None:
            self._note(uuid, field, f"{function} is not in this pynvml")
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            lost = getattr(self._nvml, "NVMLError_GpuIsLost", None)
            if lost is not None and isinstance(exc, lost):
                raise _GpuLost from exc
            self._note(uuid, field, str(exc))
            return None

    def _note(self, uuid: str, field: str, why: str) -> None:
        note_unsupported(self.unsupported, uuid, field, why)

    # -- discovery ------------------------------------------------------------------------------------------

    def discover(self) -> list[schema.GpuFacts]:
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log.warning("NVML cannot count GPUs: %s", exc)
            return []
        found: list[tuple[int, str, Any]] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError as exc:
                # A GPU NVML cannot even name is not one the control plane can book; it shows up as missing.
                log.warning("GPU at index %d is unreadable: %s", index, exc)
                continue
            found.append((index, uuid, handle))
        self._handles = {uuid: handle for _, uuid, handle in found}

        facts: dict[str, dict[str, Any]] = {}
        bus_to_uuid: dict[str, str] = {}
        for index, uuid, handle in found:
            name = self._optional("nvmlDeviceGetName", handle) or "Unknown NVIDIA GPU"
            memory = self._optional("nvmlDeviceGetMemoryInfo", handle)
            pci = self._optional("nvmlDeviceGetPciInfo", handle)
            bus_id = _text(pci.busId) if pci is not None else None
            if bus_id:
                bus_to_uuid[normalize_bus_id(bus_id)] = uuid
            numa = self._optional("nvmlDeviceGetNumaNodeId", handle)
            if numa is None and bus_id:
                numa = self._numa_from_sysfs(bus_id)
            facts[uuid] = {
                "uuid": uuid,
                "index": index,
                "name": name[:128],
                "memory_total_mib": int(memory.total // MIB) if memory is not None else 0,
                "pci_bus_id": bus_id,
                "numa_node": numa,
                "serial": self._optional("nvmlDeviceGetSerial", handle),
                "mig": self._mig.state(handle),
            }

        on_switch: set[str] = set()
        for _, uuid, handle in found:
            peers, switched = self._nvlink_peers(handle, bus_to_uuid)
            facts[uuid]["nvlink_peers"] = sorted(peers - {uuid})
            if switched:
                on_switch.add(uuid)
        for uuid in on_switch:
            facts[uuid]["nvlink_peers"] = sorted((set(facts[uuid]["nvlink_peers"]) | on_switch) - {uuid})

        if self._event_set is None and not self.events_detail:
            self._register_events()
        return [schema.GpuFacts(**facts[uuid]) for _, uuid, _ in found]

    def _numa_from_sysfs(self, bus_id: str) -> int | None:
        path = self._sysfs / "bus" / "pci" / "devices" / normalize_bus_id(bus_id) / "numa_node"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def _nvlink_peers(self, handle: Any, bus_to_uuid: dict[str, str]) -> tuple[set[str], bool]:
        nvml = self._nvml
        peers: set[str] = set()
        switched = False
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                remote = normalize_bus_id(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except nvml.NVMLError_NotSupported:
                break  # no NVLink on this GPU at all
            except nvml.NVMLError:
                continue  # a link number past this GPU's last link
            if remote in bus_to_uuid:
                peers.add(bus_to_uuid[remote])
                continue
            kind = self._optional("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            if kind == _NVLINK_SWITCH:
                switched = True
        return peers, switched

    # -- MIG ------------------------------------------------------------------------------------------------

    def configure_mig(self, uuid: str, *, enabled: bool, layout: list[str]) -> MigResult:
        """Give the GPU this MIG layout through NVML (``nodeagent.backends.nvml_mig``). The caller makes sure
        nothing of ours runs on the GPU; NVML refuses (IN_USE) when anything else does."""
        if not self._handles:
            self.discover()
        handle = self._handles.get(uuid)
        if handle is None:
            return MigResult("refused", f"GPU {uuid} is not on this node")
        result = self._mig.configure(handle, enabled=enabled, layout=layout)
        self.discover()  # the MIG devices changed: the next heartbeat reports the new ones
        return result

    # -- events ---------------------------------------------------------------------------------------------

    def _register_events(self) -> None:
        nvml = self._nvml
        xid_type = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        try:
            event_set = nvml.nvmlEventSetCreate()
        except (nvml.NVMLError, AttributeError) as exc:
            self._events_off(f"NVML cannot create an event set ({exc})")
            return
        registered = 0
        for uuid, handle in self._handles.items():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
                registered += 1
            except nvml.NVMLError as exc:
                log.warning("GPU %s: XID events are not available (%s)", uuid, exc)
        if not registered:
            self._optional("nvmlEventSetFree", event_set)
            self._events_off("no GPU accepted XID event registration")
            return
        self._event_set = event_set
        self.events_supported = True

    def _events_off(self, why: str) -> None:
        self.events_supported = False
        self.events_detail = f"XID events are not collected: {why}"
        log.warning("%s", self.events_detail)

    def poll_events(self, now: datetime) -> list[schema.AgentEvent]:
        if self._event_set is None:
            return []
        nvml = self._nvml
        events: list[schema.AgentEvent] = []
        for _ in range(schema.MAX_EVENTS):
            try:
                data = nvml.nvmlEventSetWait(self._event_set, 0)
            except nvml.NVMLError_Timeout:
                break  # nothing pending
            except nvml.NVMLError as exc:
                log.warning("reading NVML events failed: %s", exc)
                break
            if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            uuid = self._optional("nvmlDeviceGetUUID", data.device)
            xid = int(data.eventData)
            if uuid:
                self._last_xid[uuid] = xid
            events.append(
                xid_event(uuid=uuid, xid=xid, ts=now)
                if uuid
                else schema.AgentEvent(kind="xid", ts=now, xid=xid, message=f"XID {xid} on an unknown GPU")
            )
        return events

    # -- samples --------------------------------------------------------------------------------------------

    def sample(self, now: datetime) -> list[schema.GpuSample]:
        if not self._handles:
            self.discover()
        samples = []
        for uuid, handle in self._handles.items():
            try:
                fields = self._read_fields(uuid, handle)
            except _GpuLost:
                log.error("GPU %s is lost (NVML: GPU is lost)", uuid)
                continue
            # A reading NVML cannot give as a finite number is unknown, like one it does not support.
            fields = {k: v if v is None or math.isfinite(v) else None for k, v in fields.items()}
            samples.append(schema.GpuSample(uuid=uuid, ts=now, fields=fields))
        return samples

    def _read_fields(self, uuid: str, h: Any) -> dict[str, float | None]:
        nvml = self._nvml
        read = self._field
        f: dict[str, float | None] = dict.fromkeys(schema.SAMPLE_FIELDS)

        util = read(uuid, "utilization", "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            f[schema.GPU_UTIL], f[schema.MEM_COPY_UTIL] = float(util.gpu), float(util.memory)
        memory = read(uuid, "memory", "nvmlDeviceGetMemoryInfo", h)
        if memory is not None:
            f[schema.FB_USED], f[schema.FB_TOTAL] = memory.used / MIB, memory.total / MIB
        f[schema.GPU_TEMP] = _num(read(uuid, schema.GPU_TEMP, "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU))
        power_mw = read(uuid, schema.POWER_USAGE, "nvmlDeviceGetPowerUsage", h)
        f[schema.POWER_USAGE] = power_mw / 1000.0 if power_mw is not None else None
        f[schema.TOTAL_ENERGY] = _num(read(uuid, schema.TOTAL_ENERGY, "nvmlDeviceGetTotalEnergyConsumption", h))
        f[schema.SM_CLOCK] = _num(read(uuid, schema.SM_CLOCK, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM))

        corrected, uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        ecc = "nvmlDeviceGetTotalEccErrors"
        f[schema.ECC_SBE_VOL] = _num(read(uuid, schema.ECC_SBE_VOL, ecc, h, corrected, nvml.NVML_VOLATILE_ECC))
        f[schema.ECC_DBE_VOL] = _num(read(uuid, schema.ECC_DBE_VOL, ecc, h, uncorrected, nvml.NVML_VOLATILE_ECC))
        f[schema.ECC_DBE_AGG] = _num(read(uuid, schema.ECC_DBE_AGG, ecc, h, uncorrected, nvml.NVML_AGGREGATE_ECC))

        f[schema.RETIRED_PENDING] = _num(
            read(uuid, schema.RETIRED_PENDING, "nvmlDeviceGetRetiredPagesPendingStatus", h)
        )
        pages = read(
            uuid,
            schema.RETIRED_DBE,
            "nvmlDeviceGetRetiredPages",
            h,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        f[schema.RETIRED_DBE] = float(len(pages)) if pages is not None else None
        rows = read(uuid, "row remapping", "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            _corr, _unc, pending, failure = rows
            f[schema.ROW_REMAP_PENDING], f[schema.ROW_REMAP_FAILURE] = float(pending), float(failure)

        f[schema.CLOCK_THROTTLE_REASONS] = _num(self._throttle_reasons(uuid, h))
        if self._event_set is not None:
            f[schema.XID_ERRORS] = float(self._last_xid.get(uuid, 0))
        try:
            f.update(self._gpm.read(uuid, h))
        except nvml.NVMLError as exc:  # only a lost GPU comes out of the reader
            raise _GpuLost from exc
        return f

    def _throttle_reasons(self, uuid: str, h: Any) -> Any:
        # Drivers from 535 call them "clocks event reasons"; older ones only know the throttle name.
        fn = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self._nvml, fn):
            fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        try:
            return getattr(self._nvml, fn)(h)
        except self._nvml.NVMLError_FunctionNotFound:
            return self._field(uuid, schema.CLOCK_THROTTLE_REASONS, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        except self._nvml.NVMLError as exc:
            lost = getattr(self._nvml, "NVMLError_GpuIsLost", None)
            if lost is not None and isinstance(exc, lost):
                raise _GpuLost from exc
            self._note(uuid, schema.CLOCK_THROTTLE_REASONS, str(exc))
            return None

    def close(self) -> None:
        self._gpm.close()
        if self._event_set is not None:
            self._optional("nvmlEventSetFree", self._event_set)
            self._event_set = None
        self._optional("nvmlShutdown")


def _num(value: Any) -> float | None:
    return float(value) if value is not None else None
