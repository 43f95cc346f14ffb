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
        from controlplane.scheduling.preemption import on_reservation_yielded

        hooks.register_on_finished(_on_reservation_finished)
        hooks.register_on_yielded(on_reservation_yielded)
        # A secret a queued request asks for is not deleted (docs/images.md).
        from controlplane.scheduling.services import requests_asking_secret
        from controlplane.vault.services import register_secret_users

        register_secret_users(requests_asking_secret)
