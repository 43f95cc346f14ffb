from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "controlplane.notifications"
    label = "notifications"

    def ready(self) -> None:
        from controlplane.accounting import reclaim
        from controlplane.core import domain_events
        from controlplane.ledger import budgets
        from controlplane.notifications.events import (
            on_budget_alert,
            on_domain_events,
            on_idle_warning,
            on_reservation_yielded,
        )
        from controlplane.reservations import hooks as reservation_hooks

        domain_events.subscribe(on_domain_events)
        reservation_hooks.register_on_yielded(on_reservation_yielded)
        budgets.register_alert_listener(on_budget_alert)
        reclaim.register_on_idle_warning(on_idle_warning)
