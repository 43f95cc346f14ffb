from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "controlplane.accounting"
    label = "accounting"
