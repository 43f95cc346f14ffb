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
