from typing import Any

from django.core.management.base import BaseCommand

from controlplane.vault.services import rotate_keys


class Command(BaseCommand):
    help = "Re-encrypt every project secret and registry password under the first CONTROLPLANE_ENCRYPTION_KEYS key."

    def handle(self, *args: Any, **options: Any) -> None:
        count = rotate_keys()
        self.stdout.write(f"re-encrypted {count} stored value(s) under the first key")
