"""A fake ``amdsmi`` module: the shape of AMD SMI's Python API (functions, enums, ``AmdSmiLibraryException``
with its error code) over GPUs declared in the test. Values follow the library: dicts per call, VRAM in MB,
power in W, temperatures in degrees C, energy as a counter times its resolution in microjoules, and "N/A" for a
value a board does not have."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class AmdSmiRetCode(enum.IntEnum):
    STATUS_SUCCESS = 0
    STATUS_INVAL = 1
    STATUS_NOT_SUPPORTED = 2
    STATUS_NOT_YET_IMPLEMENTED = 3
    STATUS_NO_PERM = 10
    STATUS_NOT_INIT = 32
    STATUS_DRIVER_NOT_LOADED = 54


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        self.err_code = err_code
        super().__init__(f"Error code:\n\t{err_code} | {AmdSmiRetCode(err_code).name}")

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0
    MEM = 4


class AmdSmiIoLinkType(enum.IntEnum):
    UNDEFINED = 0
    PCIEXPRESS = 1
    XGMI = 2


@dataclass(eq=False)
class FakeAmdGpu:
    uuid: str
    bdf: str
    market_name: str = "AMD Instinct MI300X"
    vram_total_mb: int = 196592
    vram_used_mb: int = 2048
    numa: int = 0
    gfx_activity: Any = 37
    umc_activity: Any = 12
    temps: dict[str, int] = field(default_factory=lambda: {"EDGE": 44, "HOTSPOT": 58, "VRAM": 49})
    power_w: Any = 312
    energy_counts: int = 1_000_000
    energy_resolution_uj: float = 15.3
    gfx_clock: int = 2100
    ecc: tuple[int, int, int] = (0, 0, 0)  # correctable, uncorrectable, deferred
    unsupported: set[str] = field(default_factory=set)


class FakeAmdsmi:
    AmdSmiRetCode = AmdSmiRetCode
    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiClkType = AmdSmiClkType
    AmdSmiIoLinkType = AmdSmiIoLinkType

    def __init__(self, gpus: list[FakeAmdGpu], *, xgmi: bool = True, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.xgmi = xgmi
        self.init_error = init_error
        self.initialised = False

    def _answer(self, gpu: FakeAmdGpu, function: str, value: Any) -> Any:
        if not self.initialised:
            raise AmdSmiLibraryException(AmdSmiRetCode.STATUS_NOT_INIT)
        if function in gpu.unsupported:
            raise AmdSmiLibraryException(AmdSmiRetCode.STATUS_NOT_SUPPORTED)
        return value

    def amdsmi_init(self, flags: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self.initialised = False

    def amdsmi_get_processor_handles(self) -> list[FakeAmdGpu]:
        return list(self.gpus)

    def amdsmi_get_gpu_device_uuid(self, gpu: FakeAmdGpu) -> str:
        return self._answer(gpu, "amdsmi_get_gpu_device_uuid", gpu.uuid)

    def amdsmi_get_gpu_driver_info(self, gpu: FakeAmdGpu) -> dict[str, str]:
        info = {"driver_name": "amdgpu", "driver_version": "6.10.5", "driver_date": "2015/01/01 00:00"}
        return self._answer(gpu, "amdsmi_get_gpu_driver_info", info)

    def amdsmi_get_gpu_asic_info(self, gpu: FakeAmdGpu) -> dict[str, Any]:
        info = {
            "market_name": gpu.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "device_id": "0x74a1",
            "asic_serial": f"0x{gpu.uuid[-8:].upper()}",
        }
        return self._answer(gpu, "amdsmi_get_gpu_asic_info", info)

    def amdsmi_get_gpu_vram_usage(self, gpu: FakeAmdGpu) -> dict[str, int]:
        usage = {"vram_total": gpu.vram_total_mb, "vram_used": gpu.vram_used_mb}
        return self._answer(gpu, "amdsmi_get_gpu_vram_usage", usage)

    def amdsmi_get_gpu_device_bdf(self, gpu: FakeAmdGpu) -> str:
        return self._answer(gpu, "amdsmi_get_gpu_device_bdf", gpu.bdf)

    def amdsmi_topo_get_numa_node_number(self, gpu: FakeAmdGpu) -> int:
        return self._answer(gpu, "amdsmi_topo_get_numa_node_number", gpu.numa)

    def amdsmi_topo_get_link_type(self, a: FakeAmdGpu, b: FakeAmdGpu) -> dict[str, int]:
        kind = AmdSmiIoLinkType.XGMI if self.xgmi else AmdSmiIoLinkType.PCIEXPRESS
        return self._answer(a, "amdsmi_topo_get_link_type", {"hops": 1 if self.xgmi else 2, "type": kind})

    def amdsmi_get_gpu_activity(self, gpu: FakeAmdGpu) -> dict[str, Any]:
        activity = {"gfx_activity": gpu.gfx_activity, "umc_activity": gpu.umc_activity, "mm_activity": "N/A"}
        return self._answer(gpu, "amdsmi_get_gpu_activity", activity)

    def amdsmi_get_temp_metric(self, gpu: FakeAmdGpu, sensor: AmdSmiTemperatureType, metric: int) -> int:
        assert metric == AmdSmiTemperatureMetric.CURRENT
        name = {0: "EDGE", 1: "HOTSPOT", 2: "VRAM"}[int(sensor)]
        if name not in gpu.temps:
            raise AmdSmiLibraryException(AmdSmiRetCode.STATUS_NOT_SUPPORTED)
        return self._answer(gpu, "amdsmi_get_temp_metric", gpu.temps[name])

    def amdsmi_get_power_info(self, gpu: FakeAmdGpu) -> dict[str, Any]:
        info = {"current_socket_power": gpu.power_w, "average_socket_power": "N/A", "gfx_voltage": 0}
        return self._answer(gpu, "amdsmi_get_power_info", info)

    def amdsmi_get_energy_count(self, gpu: FakeAmdGpu) -> dict[str, Any]:
        info = {
            "energy_accumulator": gpu.energy_counts,
            "counter_resolution": gpu.energy_resolution_uj,
            "timestamp": 1,
        }
        return self._answer(gpu, "amdsmi_get_energy_count", info)

    def amdsmi_get_clock_info(self, gpu: FakeAmdGpu, kind: int) -> dict[str, Any]:
        assert kind == AmdSmiClkType.GFX
        info = {"clk": gpu.gfx_clock, "min_clk": 500, "max_clk": 2100, "clk_locked": False, "clk_deep_sleep": 0}
        return self._answer(gpu, "amdsmi_get_clock_info", info)

    def amdsmi_get_gpu_total_ecc_count(self, gpu: FakeAmdGpu) -> dict[str, int]:
        c, u, d = gpu.ecc
        info = {"correctable_count": c, "uncorrectable_count": u, "deferred_count": d}
        return self._answer(gpu, "amdsmi_get_gpu_total_ecc_count", info)


def mi300x_pair() -> tuple[FakeAmdGpu, FakeAmdGpu]:
    return (
        FakeAmdGpu(uuid="6cff74a1-0000-1000-80ed-4d2b1a3c0001", bdf="0000:0c:00.0", numa=0),
        FakeAmdGpu(uuid="6cff74a1-0000-1000-80ed-4d2b1a3c0002", bdf="0000:22:00.0", numa=1),
    )
