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
        # A secret asked for by a reservation not yet ended is not deleted (docs/images.md).
        from controlplane.reservations.holders import reservations_asking_secret
        from controlplane.vault.services import register_secret_users

        register_secret_users(reservations_asking_secret)
