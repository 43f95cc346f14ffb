from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "controlplane.reservations"
    label = "reservations"
