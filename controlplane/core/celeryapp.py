"""The Celery application; tasks live in each app's tasks.py.

It lives in core, the ground layer, because every app publishes through it (dispatch's pushes, the health
probe of the broker); ``controlplane.celery`` (``celery -A controlplane``) is the composition root's name for
the same object, and no app imports the composition root.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Lazy: the tasks modules of INSTALLED_APPS are imported when the app is finalized, not by this module.
app.autodiscover_tasks()
