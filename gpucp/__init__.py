"""gpucp: the tenant's command line for the GPU control plane, a client of its public HTTP API only."""

__version__ = "0.1.0"
