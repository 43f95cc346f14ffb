from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "controlplane.accounts"
    label = "accounts"

    def ready(self) -> None:
        # Registers the bearer token scheme with drf-spectacular.
        from controlplane.accounts import schema  # noqa: F401
