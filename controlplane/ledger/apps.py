from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "controlplane.ledger"
    label = "ledger"
