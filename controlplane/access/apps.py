from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "controlplane.access"
    label = "access"

    def ready(self) -> None:
        from controlplane.access import connect, selectors, sessions, volumes
        from controlplane.dispatch import hooks as dispatch_hooks
        from controlplane.fleet import desired as fleet_hooks
        from controlplane.reservations import hooks as reservation_hooks

        dispatch_hooks.register_authorized_keys(selectors.authorized_keys_for_projects)
        fleet_hooks.register_sessions_reported(sessions.sessions_reported)
        fleet_hooks.register_volumes_reported(volumes.volumes_reported)
        reservation_hooks.register_mounts(volumes.resolve_mounts)
        dispatch_hooks.register_container_mounts(selectors.container_mounts)
        reservation_hooks.register_access(connect.access_block)
