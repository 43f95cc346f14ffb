from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "controlplane.dispatch"
    label = "dispatch"

    def ready(self) -> None:
        # Dispatch sits above reservations and the fleet (docs/design-notes.md, Layers): it hears of every
        # booking and change, and answers every heartbeat, through the hooks those apps declare.
        from collections.abc import Sequence
        from datetime import datetime
        from typing import Any

        from controlplane.dispatch import images, recovery, reports, services
        from controlplane.fleet import desired
        from controlplane.reservations import hooks as reservation_hooks
        from nodeagent.schema import ContainerReport, ImageReport, PrePull

        def booked(reservation: Any, now: Any) -> None:
            services.dispatch_reservation_booked(reservation=reservation, now=now)

        def changed(reservation: Any) -> None:
            services.dispatch_reservation_changed(reservation=reservation)

        def desired_state_for(server: Any, now: datetime | None, has_work: bool | None) -> tuple[list[Any], list[str]]:
            return services.desired_state_for(server=server, now=now, has_work=has_work)

        def work_probe(server: Any, now: datetime) -> tuple[str, list[Any]]:
            return services.dispatch_work_probe(server_id=server.pk, now=now)

        def containers_reported(server: Any, container_reports: Sequence[ContainerReport], now: datetime) -> None:
            reports.containers_reported(server=server, reports=container_reports, now=now)

        def server_lost(server: Any, now: datetime, silent_s: float) -> int:
            return recovery.server_lost(server=server, now=now, silent_s=silent_s)

        def prepull_for(server: Any, now: datetime) -> list[PrePull]:
            return images.prepull_for(server=server, now=now)

        def images_reported(server: Any, image_reports: Sequence[ImageReport], now: datetime) -> None:
            images.images_reported(server=server, reports=image_reports, now=now)

        reservation_hooks.booked.register(booked)
        reservation_hooks.changed.register(changed)
        desired.desired_state_hook.register(desired_state_for)
        desired.work_probe_hook.register(work_probe)
        desired.containers_reported_hook.register(containers_reported)
        desired.server_lost_hook.register(server_lost)
        desired.prepull_hook.register(prepull_for)
        desired.images_reported_hook.register(images_reported)
