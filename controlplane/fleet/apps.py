from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "controlplane.fleet"
    label = "fleet"

    def ready(self) -> None:
        # The fleet sits above the inventory (docs/design-notes.md, Layers): retiring a server revokes its agent.
        from typing import Any

        from controlplane.fleet.services import revoke_active_credentials
        from controlplane.inventory import hooks as inventory_hooks

        def server_retired(server: Any, actor: Any, reason: str) -> None:
            revoke_active_credentials(server=server, actor=actor, reason=reason)

        inventory_hooks.server_retired.register(server_retired)

        # /readyz says whether node-loss handling is held (a grace, a disruption): docs/fleet.md.
        from controlplane.core import health
        from controlplane.fleet import nodeloss

        health.register_fact("node_loss", lambda: nodeloss.current_hold().as_dict())
