from django.apps import AppConfig


class SystemConfig(AppConfig):
    """The top layer: whole-system tools (``runsystem``, the demo data) that may use every app below."""

    name = "controlplane.system"
    label = "system"
