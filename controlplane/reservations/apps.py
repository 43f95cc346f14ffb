from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "controlplane.reservations"
    label = "reservations"

    def ready(self) -> None:
        # The ledger's per-member GPU-hour cap counts what the member's reservations hold: a read of this app,
        # which sits above the ledger (docs/design-notes.md, Layers).
        from controlplane.ledger import budgets
        from controlplane.reservations.holders import member_gpu_hours

        budgets.member_gpu_hours.register(member_gpu_hours)
