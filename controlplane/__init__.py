"""The control plane: a Django project whose apps are the domains of GPU rental."""

from controlplane.celery import app as celery_app

__all__ = ["celery_app"]
