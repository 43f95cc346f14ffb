from typing import Any

from django.apps import AppConfig


def _on_reservation_finished(reservation: Any) -> None:
    """GPUs were freed: run the queue pass now rather than at the next beat."""
    from controlplane.scheduling.services import trigger_pass

    trigger_pass()


class SchedulingConfig(AppConfig):
    name = "controlplane.scheduling"
    label = "scheduling"

    def ready(self) -> None:
        from controlplane.reservations import hooks

        hooks.register_on_finished(_on_reservation_finished)
