from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "controlplane.notifications"
    label = "notifications"

    def ready(self) -> None:
        from controlplane.core import domain_events
        from controlplane.notifications.events import on_domain_events

        domain_events.subscribe(on_domain_events)
