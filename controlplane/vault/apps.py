from django.apps import AppConfig


class VaultConfig(AppConfig):
    name = "controlplane.vault"
    label = "vault"
    verbose_name = "Project secrets and registry credentials"

    def ready(self) -> None:
        from controlplane.vault import checks  # noqa: F401  (registers the start-up checks)
