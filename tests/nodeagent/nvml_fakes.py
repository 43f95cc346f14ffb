"""A fake ``pynvml`` module: the real module's constants and exception classes over GPUs declared in the test.

Each GPU names the NVML functions it does not support (raising ``NVMLError_NotSupported``) and those that
fail with another NVML error, the way drivers and boards differ in the field.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as real

from nodeagent.mig import MEMORY_SLICES, PROFILES, MigProfile

MIB = 1024 * 1024
SWITCH = "switch"


@dataclass(eq=False)
class FakeGpuInstance:
    gpu: FakeGpu
    id: int
    profile: MigProfile
    start: int
    compute: dict[int, FakeComputeInstance] = field(default_factory=dict)


@dataclass(eq=False)
class FakeComputeInstance:
    gi: FakeGpuInstance
    id: int
    uuid: str
    busy: bool = False  # a process runs on it: destroying it is NVML_ERROR_IN_USE


@dataclass
class FakeMig:
    """A MIG-capable GPU as NVML shows it: mode (current, pending) and its GPU/compute instances.

    ``reset_required``: a mode change only sets the pending mode (A100 without a reset, as NVML documents);
    otherwise it applies at once (H100 with no process on the GPU). The driver places a new GPU instance at the
    first start of its profile that is free, as ``nvmlDeviceCreateGpuInstance`` does."""

    model: str  # a key of nodeagent.mig.PROFILES
    current: int = 0
    pending: int = 0
    reset_required: bool = False
    instances: dict[int, FakeGpuInstance] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)  # MIG calls that answer NotSupported
    serial: int = 0


@dataclass(eq=False)
class FakeGpu:
    uuid: str
    bus_id: str
    name: str = "NVIDIA H200"
    memory_total_mib: int = 143771
    memory_used_mib: int = 1024
    numa: int | None = 0
    nvlinks: dict[int, str] = field(default_factory=dict)  # link -> remote bus id, or SWITCH
    util: tuple[int, int] = (42, 17)
    temp: int = 51
    power_mw: int = 312_456
    energy_mj: int = 987_654_321
    sm_clock: int = 1980
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    retired_dbe_pages: list[int] = field(default_factory=list)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    throttle: int = 0x4
    unsupported: set[str] = field(default_factory=set)
    broken: set[str] = field(default_factory=set)
    lost: bool = False
    mig: FakeMig | None = None  # None: NotSupported on every MIG call, as on a GPU without MIG
    # GPM metrics in percent by metric id (a Hopper's); None: the GPU has no GPM (isSupportedDevice 0).
    gpm: dict[int, float] | None = None
    gpm_samples: int = 0  # GPM samples taken, so a test can see the agent pairs them
    gpm_freed: int = 0


class FakeGpmRequest:
    """``c_nvmlGpmMetricsGet_t`` without ctypes: the fake's samples are plain objects, not pointers."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(real.NVML_GPM_METRIC_MAX)]


class FakeNvml:
    """Looks like ``pynvml`` to ``NvmlBackend``."""

    def __init__(
        self, gpus: list[FakeGpu], *, init_error: int | None = None, events: bool = True, missing: tuple[str, ...] = ()
    ) -> None:
        for name in dir(real):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(real, name))
        self.gpus = gpus
        self.init_error = init_error
        self.events = events
        self.queue: deque[SimpleNamespace] = deque()
        self.registered: list[FakeGpu] = []
        self.shut_down = False
        self.calls: list[str] = []
        self._missing = set(missing)  # functions an older pynvml lacks

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "__dict__").get("_missing", ()):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # -- helpers --------------------------------------------------------------------------------------------

    def push_xid(self, gpu: FakeGpu, xid: int) -> None:
        self.queue.append(SimpleNamespace(device=gpu, eventType=real.nvmlEventTypeXidCriticalError, eventData=xid))

    def _answer(self, gpu: FakeGpu, function: str, value: Any) -> Any:
        self.calls.append(function)
        if gpu.lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.unsupported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if function in gpu.broken:
            raise real.NVMLError(real.NVML_ERROR_UNKNOWN)
        return value

    # -- the pynvml surface the backend uses ----------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu | FakeComputeInstance) -> str:
        if isinstance(gpu, FakeComputeInstance):
            return self._mig_answer(gpu.gi.gpu, "nvmlDeviceGetUUID", gpu.uuid)
        return self._answer(gpu, "nvmlDeviceGetUUID", gpu.uuid)

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        return self._answer(gpu, "nvmlDeviceGetName", gpu.name)

    def nvmlDeviceGetSerial(self, gpu: FakeGpu) -> str:
        return self._answer(gpu, "nvmlDeviceGetSerial", f"serial-{gpu.uuid[-4:]}")

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu | FakeComputeInstance) -> SimpleNamespace:
        if isinstance(gpu, FakeComputeInstance):
            total = gpu.gi.profile.memory_mib * MIB
            info = SimpleNamespace(total=total, used=0, free=total)
            return self._mig_answer(gpu.gi.gpu, "nvmlDeviceGetMemoryInfo", info)
        total, used = gpu.memory_total_mib * MIB, gpu.memory_used_mib * MIB
        return self._answer(gpu, "nvmlDeviceGetMemoryInfo", SimpleNamespace(total=total, used=used, free=total - used))

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> SimpleNamespace:
        return self._answer(gpu, "nvmlDeviceGetPciInfo", SimpleNamespace(busId=gpu.bus_id.encode()))

    def nvmlDeviceGetNumaNodeId(self, gpu: FakeGpu) -> int:
        if gpu.numa is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return self._answer(gpu, "nvmlDeviceGetNumaNodeId", gpu.numa)

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        if not gpu.nvlinks:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if link >= 18:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return int(link in gpu.nvlinks)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, gpu: FakeGpu, link: int) -> SimpleNamespace:
        remote = gpu.nvlinks[link]
        return SimpleNamespace(busId=(b"00000000:FF:00.0" if remote == SWITCH else remote.encode()))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, gpu: FakeGpu, link: int) -> int:
        return real.NVML_NVLINK_DEVICE_TYPE_SWITCH if gpu.nvlinks[link] == SWITCH else real.NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> SimpleNamespace:
        return self._answer(gpu, "nvmlDeviceGetUtilizationRates", SimpleNamespace(gpu=gpu.util[0], memory=gpu.util[1]))

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        assert sensor == real.NVML_TEMPERATURE_GPU
        return self._answer(gpu, "nvmlDeviceGetTemperature", gpu.temp)

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return self._answer(gpu, "nvmlDeviceGetPowerUsage", gpu.power_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        return self._answer(gpu, "nvmlDeviceGetTotalEnergyConsumption", gpu.energy_mj)

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        assert clock == real.NVML_CLOCK_SM
        return self._answer(gpu, "nvmlDeviceGetClockInfo", gpu.sm_clock)

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter_type: int) -> int:
        return self._answer(gpu, "nvmlDeviceGetTotalEccErrors", gpu.ecc.get((error_type, counter_type), 0))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu: FakeGpu) -> int:
        return self._answer(gpu, "nvmlDeviceGetRetiredPagesPendingStatus", 0)

    def nvmlDeviceGetRetiredPages(self, gpu: FakeGpu, cause: int) -> list[int]:
        assert cause == real.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        return self._answer(gpu, "nvmlDeviceGetRetiredPages", gpu.retired_dbe_pages)

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu) -> tuple[int, int, int, int]:
        return self._answer(gpu, "nvmlDeviceGetRemappedRows", gpu.remapped)

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        return self._answer(gpu, "nvmlDeviceGetCurrentClocksEventReasons", gpu.throttle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        return self._answer(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons", gpu.throttle)

    # -- MIG ------------------------------------------------------------------------------------------------

    def _mig(self, gpu: FakeGpu, function: str) -> FakeMig:
        self.calls.append(function)
        if gpu.mig is None or function in gpu.mig.unsupported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.mig

    def _mig_answer(self, gpu: FakeGpu, function: str, value: Any) -> Any:
        self._mig(gpu, function)
        return value

    def _profile_for_index(self, mig: FakeMig, index: int) -> MigProfile:
        for profile in PROFILES[mig.model].values():
            if getattr(real, profile.nvml_index) == index:
                return profile
        raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        mig = self._mig(gpu, "nvmlDeviceGetMigMode")
        return [mig.current, mig.pending]

    def nvmlDeviceSetMigMode(self, gpu: FakeGpu, mode: int) -> int:
        mig = self._mig(gpu, "nvmlDeviceSetMigMode")
        if mode == real.NVML_DEVICE_MIG_DISABLE and mig.instances:
            raise real.NVMLError(real.NVML_ERROR_IN_USE)
        mig.pending = mode
        if not mig.reset_required:
            mig.current = mode
        return real.NVML_SUCCESS

    def reset(self, gpu: FakeGpu) -> None:
        """``nvidia-smi -r``: a pending MIG mode takes effect."""
        assert gpu.mig is not None
        gpu.mig.current = gpu.mig.pending

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        self._mig(gpu, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def _mig_devices(self, gpu: FakeGpu) -> list[FakeComputeInstance]:
        assert gpu.mig is not None
        return [ci for gi in sorted(gpu.mig.instances.values(), key=lambda g: g.id) for ci in gi.compute.values()]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> FakeComputeInstance:
        mig = self._mig(gpu, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not mig.current:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        devices = self._mig_devices(gpu)
        if index >= len(devices):
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return devices[index]

    def nvmlDeviceGetGpuInstanceId(self, ci: FakeComputeInstance) -> int:
        return self._mig_answer(ci.gi.gpu, "nvmlDeviceGetGpuInstanceId", ci.gi.id)

    def nvmlDeviceGetComputeInstanceId(self, ci: FakeComputeInstance) -> int:
        return self._mig_answer(ci.gi.gpu, "nvmlDeviceGetComputeInstanceId", ci.id)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, gpu: FakeGpu, index: int, version: int = 2) -> SimpleNamespace:
        mig = self._mig(gpu, "nvmlDeviceGetGpuInstanceProfileInfo")
        p = self._profile_for_index(mig, index)
        return SimpleNamespace(
            version=version,
            id=p.profile_id,
            sliceCount=p.compute_slices,
            instanceCount=p.instances,
            memorySizeMB=p.memory_mib,
            name=f"MIG {p.name}".encode(),
        )

    def nvmlDeviceGetGpuInstanceById(self, gpu: FakeGpu, gi_id: int) -> FakeGpuInstance:
        mig = self._mig(gpu, "nvmlDeviceGetGpuInstanceById")
        if gi_id not in mig.instances:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return mig.instances[gi_id]

    def nvmlGpuInstanceGetInfo(self, gi: FakeGpuInstance) -> SimpleNamespace:
        self._mig(gi.gpu, "nvmlGpuInstanceGetInfo")
        placement = SimpleNamespace(start=gi.start, size=gi.profile.memory_slices)
        return SimpleNamespace(device=gi.gpu, id=gi.id, profileId=gi.profile.profile_id, placement=placement)

    def nvmlDeviceCreateGpuInstance(self, gpu: FakeGpu, profile_id: int) -> FakeGpuInstance:
        mig = self._mig(gpu, "nvmlDeviceCreateGpuInstance")
        if not mig.current:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        profile = next((p for p in PROFILES[mig.model].values() if p.profile_id == profile_id), None)
        if profile is None:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        used = {s for gi in mig.instances.values() for s in range(gi.start, gi.start + gi.profile.memory_slices)}
        compute = sum(gi.profile.compute_slices for gi in mig.instances.values())
        same = sum(1 for gi in mig.instances.values() if gi.profile is profile)
        if compute + profile.compute_slices > 7 or same >= profile.instances:
            raise real.NVMLError(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        for start in profile.starts:
            span = set(range(start, start + profile.memory_slices))
            if max(span) < MEMORY_SLICES and not span & used:
                gi_id = next(i for i in range(1, 15) if i not in mig.instances)
                gi = mig.instances[gi_id] = FakeGpuInstance(gpu=gpu, id=gi_id, profile=profile, start=start)
                return gi
        raise real.NVMLError(real.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: FakeGpuInstance, profile: int, engine: int, version: int = 2
    ) -> SimpleNamespace:
        self._mig(gi.gpu, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
        assert engine == real.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        slices = {getattr(real, f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE"): n for n in (1, 2, 3, 4, 7)}[profile]
        if slices > gi.profile.compute_slices:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=profile, sliceCount=slices)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: FakeGpuInstance, profile_id: int) -> FakeComputeInstance:
        mig = self._mig(gi.gpu, "nvmlGpuInstanceCreateComputeInstance")
        if gi.compute:
            raise real.NVMLError(real.NVML_ERROR_INSUFFICIENT_RESOURCES)
        mig.serial += 1
        uuid = f"MIG-{gi.gpu.uuid[4:12]}-{mig.serial:04x}-4000-8000-{gi.id:012x}"
        ci = gi.compute[0] = FakeComputeInstance(gi=gi, id=0, uuid=uuid)
        return ci

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: FakeGpuInstance, ci_id: int) -> FakeComputeInstance:
        self._mig(gi.gpu, "nvmlGpuInstanceGetComputeInstanceById")
        if ci_id not in gi.compute:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return gi.compute[ci_id]

    def nvmlComputeInstanceDestroy(self, ci: FakeComputeInstance) -> None:
        self._mig(ci.gi.gpu, "nvmlComputeInstanceDestroy")
        if ci.busy:
            raise real.NVMLError(real.NVML_ERROR_IN_USE)
        del ci.gi.compute[ci.id]

    def nvmlGpuInstanceDestroy(self, gi: FakeGpuInstance) -> None:
        mig = self._mig(gi.gpu, "nvmlGpuInstanceDestroy")
        if gi.compute:
            raise real.NVMLError(real.NVML_ERROR_IN_USE)
        del mig.instances[gi.id]

    def nvmlEventSetCreate(self) -> object:
        if not self.events:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return object()

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, types: int, event_set: object) -> None:
        assert types == real.nvmlEventTypeXidCriticalError
        self._answer(gpu, "nvmlDeviceRegisterEvents", None)
        self.registered.append(gpu)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0, "the agent must never block on NVML events"
        if not self.queue:
            raise real.NVMLError(real.NVML_ERROR_TIMEOUT)
        return self.queue.popleft()

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass

    # -- GPM (Hopper and newer): DCGM's profiling fields ------------------------------------------------------

    c_nvmlGpmMetricsGet_t = FakeGpmRequest

    def nvmlGpmQueryDeviceSupport(self, gpu: FakeGpu) -> SimpleNamespace:
        support = SimpleNamespace(isSupportedDevice=int(gpu.gpm is not None))
        return self._answer(gpu, "nvmlGpmQueryDeviceSupport", support)

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        return SimpleNamespace(gpu=None, n=None)

    def nvmlGpmSampleGet(self, gpu: FakeGpu, sample: SimpleNamespace) -> SimpleNamespace:
        self._answer(gpu, "nvmlGpmSampleGet", None)
        gpu.gpm_samples += 1
        sample.gpu, sample.n = gpu, gpu.gpm_samples
        return sample

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        if sample.gpu is not None:
            sample.gpu.gpm_freed += 1

    def nvmlGpmMetricsGet(self, request: FakeGpmRequest) -> FakeGpmRequest:
        gpu = request.sample1.gpu
        assert request.version == real.NVML_GPM_METRICS_GET_VERSION
        assert request.sample2.gpu is gpu and request.sample2.n > request.sample1.n, "samples must pair in order"
        self._answer(gpu, "nvmlGpmMetricsGet", None)
        for metric in request.metrics[: request.numMetrics]:
            if gpu.gpm is not None and metric.metricId in gpu.gpm:
                metric.nvmlReturn, metric.value = real.NVML_SUCCESS, gpu.gpm[metric.metricId]
            else:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return request


def hgx_pair(*, sysfs_numa: bool = False) -> tuple[FakeGpu, FakeGpu]:
    """Two GPUs linked to each other by NVLink."""
    a = FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001", bus_id="00000000:18:00.0", numa=0)
    b = FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000002", bus_id="00000000:2A:00.0", numa=1)
    a.nvlinks = {0: b.bus_id, 1: b.bus_id}
    b.nvlinks = {0: a.bus_id, 1: a.bus_id}
    if sysfs_numa:
        a.numa = b.numa = None
    return a, b
