"""DCGM's profiling fields read through NVML's GPM API (GPU Performance Monitoring, Hopper and newer).

NVML has no call for "SM active" and the like: DCGM computes them from hardware counters. GPM exposes the same
counters to NVML clients: take a GPM sample of a GPU now and one a sampling interval later, and
``nvmlGpmMetricsGet`` turns the two into metrics, each a percentage over the interval. So the first reading of
a GPU has none (it is the first sample of the pair), and every later one covers the time since the previous.

A GPU without GPM (older than Hopper, or a driver or pynvml without the API) reports the fields as null,
logged once; the rest of its sample is untouched. The ``pynvml`` module is passed in, as for the backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from nodeagent import schema

# DCGM field -> GPM metric. Both are averages over the interval; GPM gives percent, DCGM a ratio.
METRICS = (
    (schema.PROF_SM_ACTIVE, "NVML_GPM_METRIC_SM_UTIL"),
    (schema.PROF_PIPE_TENSOR_ACTIVE, "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    (schema.PROF_DRAM_ACTIVE, "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
_API = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmSampleFree",
    "nvmlGpmMetricsGet",
    "c_nvmlGpmMetricsGet_t",
    "NVML_GPM_METRICS_GET_VERSION",
)


class GpmReader:
    """Per GPU: the previous GPM sample, and whether GPM works there at all. ``note(uuid, field, why)`` logs a
    field as unavailable once; ``is_lost(exc)`` tells an NVML error that means the GPU is gone, which is
    raised for the backend to drop the GPU's sample."""

    def __init__(self, nvml: Any, *, note: Callable[[str, str, str], None], is_lost: Callable[[Exception], bool]):
        self._nvml = nvml
        self._note = note
        self._is_lost = is_lost
        self._previous: dict[str, Any] = {}
        self._off: set[str] = set()
        self._api = all(hasattr(nvml, name) for name in _API)

    def read(self, uuid: str, handle: Any) -> dict[str, float | None]:
        out: dict[str, float | None] = dict.fromkeys(schema.PROFILING_FIELDS)
        if uuid in self._off:
            return out
        if not self._api:
            return self._turn_off(uuid, "this pynvml has no GPM API", out)
        nvml = self._nvml
        try:
            if uuid not in self._previous and not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return self._turn_off(uuid, "GPM is not supported on this GPU (Hopper or newer has it)", out)
            sample = nvml.nvmlGpmSampleAlloc()
            try:
                nvml.nvmlGpmSampleGet(handle, sample)
            except nvml.NVMLError:
                nvml.nvmlGpmSampleFree(sample)
                raise
        except nvml.NVMLError as exc:
            if self._is_lost(exc):
                raise
            not_supported = getattr(nvml, "NVMLError_NotSupported", ())
            if isinstance(exc, not_supported):
                return self._turn_off(uuid, f"GPM: {exc}", out)
            for name in schema.PROFILING_FIELDS:
                self._note(uuid, name, f"GPM sample: {exc}")
            return out
        previous = self._previous.get(uuid)
        self._previous[uuid] = sample
        if previous is None:
            return out  # a metric needs two samples: the next reading has one
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(METRICS)
            request.sample1 = previous
            request.sample2 = sample
            for i, (_, metric) in enumerate(METRICS):
                request.metrics[i].metricId = getattr(nvml, metric)
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            if self._is_lost(exc):
                raise
            for name in schema.PROFILING_FIELDS:
                self._note(uuid, name, f"GPM metrics: {exc}")
            return out
        finally:
            self._free(previous)
        for i, (name, _) in enumerate(METRICS):
            metric = request.metrics[i]
            value = float(metric.value)
            if metric.nvmlReturn == nvml.NVML_SUCCESS and math.isfinite(value):
                out[name] = round(max(0.0, min(1.0, value / 100.0)), 4)
            else:
                self._note(uuid, name, f"GPM metric {metric.metricId} returned {metric.nvmlReturn}")
        return out

    def _turn_off(self, uuid: str, why: str, out: dict[str, float | None]) -> dict[str, float | None]:
        self._off.add(uuid)
        for name in schema.PROFILING_FIELDS:
            self._note(uuid, name, why)
        return out

    def _free(self, sample: Any) -> None:
        try:
            self._nvml.nvmlGpmSampleFree(sample)
        except self._nvml.NVMLError:
            pass  # nothing to do about a sample that cannot be freed; it was read

    def close(self) -> None:
        for sample in self._previous.values():
            self._free(sample)
        self._previous.clear()
