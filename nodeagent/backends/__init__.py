"""GPU backends: NVML on real servers, a declared simulated fleet for demos and tests."""

from nodeagent.backends.base import BackendUnavailable, GpuBackend

__all__ = ["BackendUnavailable", "GpuBackend"]
