"""Create the demo data (operator, tenant ``alice`` in project ``demo``, GPU catalog) without starting anything."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from controlplane.system.management.demo import seed_catalog, seed_demo


class Command(BaseCommand):
    help = "Create the demo operator, the demo tenant and project, and the GPU catalog (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--catalog-only",
            action="store_true",
            help="Only add the catalog entries (H100-80GB, A100-40GB, MI300X, MI250X, with list prices), no accounts.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["catalog_only"]:
            added = seed_catalog()
            self.stdout.write(f"GPU catalog: added {', '.join(added)}" if added else "GPU catalog: already present")
            return
        result = seed_demo()
        for note in result.notes:
            self.stdout.write(note)
        for login in result.logins:
            password = login.password or "(unchanged since it was set)"
            self.stdout.write(f"login: {login.username} / {password}  [{login.role}]")
