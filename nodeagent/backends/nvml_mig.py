"""MIG through NVML: what a GPU's MIG mode and devices are, and changing its layout.

Reading follows what nvidia-smi does: ``nvmlDeviceGetMigMode`` gives (current, pending) and answers
NotSupported on a GPU without MIG; ``nvmlDeviceGetMaxMigDeviceCount`` bounds the MIG device slots, and
``nvmlDeviceGetMigDeviceHandleByIndex`` answers NOT_FOUND for an empty slot. A MIG device handle answers
``nvmlDeviceGetUUID`` ("MIG-..."), ``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetComputeInstanceId`` and
``nvmlDeviceGetMemoryInfo``; its GPU instance (``nvmlDeviceGetGpuInstanceById`` then ``nvmlGpuInstanceGetInfo``)
gives the profile id and placement, and the parent's ``nvmlDeviceGetGpuInstanceProfileInfo`` (version 2, with
the profile's name) gives the profile's name, slices and memory. Every read is on its own: a call that fails
leaves its field null and never loses the device or the GPU.

Writing: destroy every compute then GPU instance, switch the MIG mode if asked, then create the layout's GPU
instances largest first (the driver places each at the first free start, so that order is the one that packs)
with one compute instance spanning each. A refusal by NVML (``NVML_ERROR_INSUFFICIENT_RESOURCES`` for a layout
that does not fit) undoes what this change created and is reported with NVML's own error name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent import schema
from nodeagent.mig import MigResult, profile_name

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# NVML numbers GPU instances from 0 and never past this on any MIG GPU (H100: 1..14).
_MAX_GPU_INSTANCE_ID = 32


@dataclass(frozen=True)
class _Profile:
    index: int  # the NVML_GPU_INSTANCE_PROFILE_* value the profile-info call takes
    profile_id: int
    name: str | None
    compute_slices: int | None
    memory_mib: int | None
    instances: int | None


def error_name(nvml: Any, exc: Exception) -> str:
    """NVML's own name for an error (NVML_ERROR_INSUFFICIENT_RESOURCES): readable without the driver loaded."""
    code = getattr(exc, "value", None)
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == code:
            return name
    return str(exc)


class NvmlMig:
    """MIG reads and writes for ``NvmlBackend``; ``nvml`` is the pynvml module (or a fake)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def _call(self, function: str, *args: Any) -> Any:
        fn = getattr(self.nvml, function, None)
        if fn is None:
            return None
        try:
            value = fn(*args)
        except self.nvml.NVMLError:
            return None
        return value.decode() if isinstance(value, bytes) else value

    # -- reading --------------------------------------------------------------------------------------------

    def profiles(self, handle: Any) -> dict[int, _Profile]:
        """The GPU instance profiles this GPU offers, by NVML profile id."""
        found: dict[int, _Profile] = {}
        count = getattr(self.nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0)
        for index in range(count):
            info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, index)
            if info is None:
                continue  # NotSupported: not a profile of this GPU
            raw_name = getattr(info, "name", None)
            name = profile_name(raw_name.decode() if isinstance(raw_name, bytes) else raw_name) if raw_name else None
            memory = getattr(info, "memorySizeMB", None)
            found[int(info.id)] = _Profile(
                index=index,
                profile_id=int(info.id),
                name=name or None,
                compute_slices=_int(getattr(info, "sliceCount", None)),
                memory_mib=_int(memory),
                instances=_int(getattr(info, "instanceCount", None)),
            )
        return found

    def state(self, handle: Any) -> schema.MigState | None:
        """The GPU's MIG state; None when it cannot do MIG (NotSupported) or NVML cannot say."""
        mode = self._call("nvmlDeviceGetMigMode", handle)
        if mode is None:
            return None
        current, pending = (bool(m) for m in mode)
        profiles = self.profiles(handle)
        devices = self._devices(handle, profiles) if current else []
        offered = {p.name: p.instances for p in profiles.values() if p.name and p.instances is not None}
        return schema.MigState(current=current, pending=pending, devices=devices, profiles=offered)

    def _devices(self, handle: Any, profiles: dict[int, _Profile]) -> list[schema.MigDevice]:
        nvml = self.nvml
        slots = self._call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        devices: list[schema.MigDevice] = []
        for slot in range(int(slots)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_NotFound:
                continue  # an empty slot
            except nvml.NVMLError as exc:
                log.info("MIG device slot %d is unreadable: %s", slot, exc)
                continue
            uuid = self._call("nvmlDeviceGetUUID", mig)
            if not uuid:
                log.info("MIG device slot %d has no readable UUID; it is left out", slot)
                continue  # a device nothing can name cannot be given to a container
            gi_id = _int(self._call("nvmlDeviceGetGpuInstanceId", mig))
            ci_id = _int(self._call("nvmlDeviceGetComputeInstanceId", mig))
            memory = self._call("nvmlDeviceGetMemoryInfo", mig)
            info = None
            if gi_id is not None:
                gi = self._call("nvmlDeviceGetGpuInstanceById", handle, gi_id)
                info = self._call("nvmlGpuInstanceGetInfo", gi) if gi is not None else None
            profile_id = _int(getattr(info, "profileId", None)) if info is not None else None
            placement = getattr(info, "placement", None) if info is not None else None
            profile = profiles.get(profile_id) if profile_id is not None else None
            devices.append(
                schema.MigDevice(
                    uuid=str(uuid),
                    gpu_instance_id=gi_id,
                    compute_instance_id=ci_id,
                    profile=profile.name if profile else None,
                    profile_id=profile_id,
                    memory_mib=(
                        int(memory.total // MIB) if memory is not None else (profile.memory_mib if profile else None)
                    ),
                    compute_slices=profile.compute_slices if profile else None,
                    memory_slices=_int(getattr(placement, "size", None)),
                    placement_start=_int(getattr(placement, "start", None)),
                )
            )
        return devices

    # -- writing --------------------------------------------------------------------------------------------

    def configure(self, handle: Any, *, enabled: bool, layout: Sequence[str]) -> MigResult:
        nvml = self.nvml
        try:
            current, _pending = (bool(m) for m in nvml.nvmlDeviceGetMigMode(handle))
        except nvml.NVMLError as exc:
            return MigResult("refused", f"this GPU cannot do MIG (nvmlDeviceGetMigMode: {error_name(nvml, exc)})")
        if not enabled and layout:
            return MigResult("refused", "a layout needs MIG enabled")
        if current:
            refused = self._destroy_all(handle)
            if refused:
                return MigResult("refused", refused)
        if current != enabled:
            mode = nvml.NVML_DEVICE_MIG_ENABLE if enabled else nvml.NVML_DEVICE_MIG_DISABLE
            try:
                nvml.nvmlDeviceSetMigMode(handle, mode)
            except nvml.NVMLError as exc:
                return MigResult("refused", f"nvmlDeviceSetMigMode: {error_name(nvml, exc)}")
            now, pending = (bool(m) for m in nvml.nvmlDeviceGetMigMode(handle))
            if now != enabled:
                # NVML took the change as pending: it applies when the GPU is reset with nothing using it.
                return MigResult(
                    "reset_required",
                    f"MIG mode {'enable' if pending else 'disable'} is pending until the GPU is reset "
                    "(nvidia-smi -r -i <index>, with no process using the GPU)",
                )
        if not enabled:
            return MigResult("applied", "MIG disabled")
        profiles = {p.name: p for p in self.profiles(handle).values() if p.name}
        unknown = [name for name in layout if name not in profiles]
        if unknown:
            return MigResult(
                "refused", f"{unknown[0]!r} is not a MIG profile of this GPU; it offers {', '.join(profiles)}"
            )
        # Largest first: the driver puts each GPU instance at its profile's first free start.
        ordered = sorted(layout, key=lambda name: -(profiles[name].compute_slices or 0))
        created: list[tuple[Any, Any]] = []
        for name in ordered:
            profile = profiles[name]
            try:
                gi = nvml.nvmlDeviceCreateGpuInstance(handle, profile.profile_id)
            except nvml.NVMLError as exc:
                self._undo(created)
                return MigResult(
                    "refused", f"NVML refused GPU instance {name} of {' + '.join(layout)}: {error_name(nvml, exc)}"
                )
            try:
                ci_index = getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{profile.compute_slices}_SLICE")
                ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
                ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            except (nvml.NVMLError, AttributeError) as exc:
                created.append((gi, None))
                self._undo(created)
                why = error_name(nvml, exc) if isinstance(exc, nvml.NVMLError) else str(exc)
                return MigResult("refused", f"NVML refused the compute instance of {name}: {why}")
            created.append((gi, ci))
        return MigResult("applied", "MIG layout " + (" + ".join(layout) if layout else "empty") + " applied")

    def _destroy_all(self, handle: Any) -> str | None:
        """Destroy every compute instance, then every GPU instance; the reason when NVML refuses one."""
        nvml = self.nvml
        for gi_id in range(_MAX_GPU_INSTANCE_ID):
            try:
                gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            except nvml.NVMLError:
                continue  # no GPU instance with this id
            for ci_id in range(8):
                try:
                    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                except nvml.NVMLError:
                    continue
                try:
                    nvml.nvmlComputeInstanceDestroy(ci)
                except nvml.NVMLError as exc:
                    # NVML_ERROR_IN_USE: a process still runs on it.
                    return f"NVML refused to destroy compute instance {ci_id} of GPU instance {gi_id}: " + error_name(
                        nvml, exc
                    )
            try:
                nvml.nvmlGpuInstanceDestroy(gi)
            except nvml.NVMLError as exc:
                return f"NVML refused to destroy GPU instance {gi_id}: {error_name(nvml, exc)}"
        return None

    def _undo(self, created: list[tuple[Any, Any]]) -> None:
        nvml = self.nvml
        for gi, ci in reversed(created):
            try:
                if ci is not None:
                    nvml.nvmlComputeInstanceDestroy(ci)
                nvml.nvmlGpuInstanceDestroy(gi)
            except nvml.NVMLError as exc:
                log.warning("undoing a refused MIG layout left an instance behind: %s", exc)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
