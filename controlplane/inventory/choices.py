from django.db import models


class ServerState(models.TextChoices):
    COMMISSIONING = "commissioning", "Commissioning"
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    MAINTENANCE = "maintenance", "Maintenance"
    OFFLINE = "offline", "Offline"
    RETIRED = "retired", "Retired"


class GpuHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    UNHEALTHY = "unhealthy", "Unhealthy"


class Vendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    AMD = "amd", "AMD"


class MigChange(models.TextChoices):
    """Where an operator's MIG reconfiguration of a GPU stands."""

    NONE = "", "None"
    APPLYING = "applying", "Waiting for the agent"
    RESET_REQUIRED = "reset_required", "Mode change pending a GPU reset"
    REFUSED = "refused", "Refused by the GPU"


class EventKind(models.TextChoices):
    STATE = "state", "State change"
    ENROLLED = "enrolled", "Enrolled"
    CREDENTIAL_REVOKED = "credential_revoked", "Credential revoked"
    GPU_ADDED = "gpu_added", "GPU added"
    GPU_MISSING = "gpu_missing", "GPU missing"
    GPU_RETURNED = "gpu_returned", "GPU returned"
    GPU_HEALTH = "gpu_health", "GPU health changed"
    GPU_ACKNOWLEDGED = "gpu_acknowledged", "GPU fault acknowledged"
    GPU_MODEL_ADDED = "gpu_model_added", "Unknown GPU model added to the catalog"
    MIG_CHANGED = "mig_changed", "MIG devices changed"
    MIG_REQUESTED = "mig_requested", "MIG reconfiguration requested"
    MIG_APPLIED = "mig_applied", "MIG reconfiguration applied"
    MIG_REFUSED = "mig_refused", "MIG reconfiguration refused"
    MIG_RESET_REQUIRED = "mig_reset_required", "MIG mode change pending a GPU reset"
