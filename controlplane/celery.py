"""The Celery application (``celery -A controlplane``), defined in ``controlplane.core.celeryapp``."""

from controlplane.core.celeryapp import app

__all__ = ["app"]
