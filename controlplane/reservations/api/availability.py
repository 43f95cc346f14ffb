"""Availability: what is free for a spec and window, the earliest window that fits, and a per-GPU timeline."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.selectors import projects_visible_to
from controlplane.core.api.fields import AwareDateTimeField, StrictBooleanField
from controlplane.core.api.query import query_data
from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, MigDevice, Server
from controlplane.reservations import mig
from controlplane.reservations.api.fields import GpuModelField, StartField
from controlplane.reservations.api.serializers import BookingSpecSerializer, spec_from
from controlplane.reservations.models import Reservation
from controlplane.reservations.selectors import booking_proposal, free_for, timeline, unavailability
from controlplane.reservations.specs import GpuSpec, Window
from controlplane.reservations.windows import earliest_booking

MAX_TIMELINE_DAYS = 62


class _QueryBooleanField(StrictBooleanField):
    """true or false in a query string (which ``query_data`` hands over as a plain dict of text)."""

    def to_internal_value(self, data: Any) -> bool:
        if data in ("true", "false"):
            return data == "true"
        return super().to_internal_value(data)


class _AvailabilitySpecSerializer(BookingSpecSerializer):
    """A booking's spec, slices included, read from a query string."""

    slices = _QueryBooleanField(
        required=False,
        default=False,
        help_text="With min_memory_mib: units may be MIG slices with at least that memory (as booking takes them).",
    )


class FreeQuerySerializer(_AvailabilitySpecSerializer):
    start = StartField(help_text='ISO 8601, or "now".')
    end = AwareDateTimeField()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": ["The window must end after it starts."]})
        return attrs


class EarliestQuerySerializer(_AvailabilitySpecSerializer):
    duration_hours = serializers.DecimalField(
        max_digits=8, decimal_places=3, min_value=Decimal("0.01"), max_value=Decimal(24 * 90)
    )
    within_days = serializers.IntegerField(min_value=1, max_value=90, default=7)


class TimelineQuerySerializer(serializers.Serializer):
    start = StartField()
    end = AwareDateTimeField()
    server = serializers.CharField(
        required=False,
        max_length=Server._meta.get_field("hostname").max_length,
        help_text="Only this server (hostname).",
    )
    gpu_model = GpuModelField(required=False)
    limit = serializers.IntegerField(min_value=1, max_value=1000, default=200, help_text="GPUs per page.")
    offset = serializers.IntegerField(min_value=0, default=0)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": ["The range must end after it starts."]})
        if attrs["end"] - attrs["start"] > timedelta(days=MAX_TIMELINE_DAYS):
            raise serializers.ValidationError({"end": [f"The range may span at most {MAX_TIMELINE_DAYS} days."]})
        return attrs


class TimelineSegmentSerializer(serializers.Serializer):
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    active = serializers.BooleanField()
    mine = serializers.BooleanField(help_text="Held by a project the caller can see.")
    reservation = serializers.UUIDField(allow_null=True, help_text="Only for the caller's own projects.")
    project = serializers.CharField(allow_null=True, help_text="The project's slug; only for the caller's own.")
    yielding = serializers.BooleanField(
        help_text="Held by a preemptible reservation: capacity a non-preemptible booking can take, after the "
        "holder's notice."
    )


class UnavailableSerializer(serializers.Serializer):
    reason = serializers.ChoiceField(
        choices=["draining", "maintenance", "offline", "commissioning", "unhealthy"],
        help_text="Why the GPU cannot be booked now: its server's state, or its health.",
    )
    detail = serializers.CharField(help_text="The reason given for the server's state, or the GPU's health reasons.")


class TimelineGpuSerializer(serializers.Serializer):
    gpu = serializers.CharField(help_text="The GPU's UUID.")
    server = serializers.CharField()
    index = serializers.IntegerField()
    gpu_model = serializers.CharField()
    server_state = serializers.ChoiceField(choices=ServerState.choices)
    health = serializers.ChoiceField(choices=GpuHealth.choices)
    unavailable = UnavailableSerializer(
        allow_null=True, help_text="Set while the GPU cannot be booked (until its server or health changes)."
    )
    segments = TimelineSegmentSerializer(many=True)


def _uuids(ids: list[int] | None, *, slices: bool = False) -> list[str] | None:
    if ids is None:
        return None
    by_id = dict((MigDevice if slices else Gpu).objects.filter(pk__in=ids).values_list("pk", "uuid"))
    return [by_id[i] for i in ids]


_PROFILE_HELP = (
    "For a slice spec (mig_profile, or slices by memory): the MIG profile answered, whose free slices and proposal "
    "are MIG device uuids; null when the answer is whole GPUs."
)


def _free_slices(spec: GpuSpec, window: Window) -> dict[str, Any] | None:
    """The free answer for a slice spec, by the booking rule (``mig.first_fit``): the first profile that fits,
    else, for a ``mig_profile``, its free slices with no proposal. None: slices by memory that no profile
    fits, which whole GPUs answer."""
    fit = mig.first_fit(spec, window)
    if fit is not None:
        profile_spec, free, chosen = fit
    elif spec.mig_profile is not None:
        profile_spec, free, chosen = spec, mig.free_slices(spec, window), None
    else:
        return None
    uuid_of = dict(MigDevice.objects.filter(pk__in=[s.id for s in free]).values_list("pk", "uuid"))
    by_host: dict[str, list[str]] = {}
    for slot in sorted(free, key=lambda s: (s.hostname, s.gpu_index, s.start)):
        by_host.setdefault(slot.hostname, []).append(uuid_of[slot.id])
    return {
        "free_gpus": len(free),
        "servers": [{"hostname": host, "free": uuids, "whole": False} for host, uuids in by_host.items()],
        "proposal": [uuid_of[i] for i in chosen] if chosen else None,
        "mig_profile": profile_spec.mig_profile,
    }


class FreeView(APIView):
    @extend_schema(
        parameters=[FreeQuerySerializer],
        summary="What is free for a spec in [start, end)",
        responses=inline_serializer(
            "FreeAnswer",
            {
                "free_gpus": serializers.IntegerField(help_text="Free GPUs; for a slice answer, free slices."),
                "servers": serializers.ListField(child=serializers.DictField()),
                "proposal": serializers.ListField(
                    child=serializers.CharField(),
                    allow_null=True,
                    help_text="UUIDs of the GPUs a booking of this spec and window made now would get "
                    "(the placement booking runs, as a dry run); null when it does not fit.",
                ),
                "mig_profile": serializers.CharField(allow_null=True, help_text=_PROFILE_HELP),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        query = FreeQuerySerializer(data=query_data(request, FreeQuerySerializer))
        query.is_valid(raise_exception=True)
        data = query.validated_data
        spec, window = spec_from(data), Window(data["start"], data["end"])
        if spec.mig_profile is not None or spec.slices:
            sliced = _free_slices(spec, window)
            if sliced is not None:
                return Response({"start": data["start"], "end": data["end"], **sliced})
            spec = spec.whole_only  # slices by memory that no profile fits: whole GPUs, as booking takes
        summary = free_for(spec, window)
        # The proposal is what booking itself would choose (its reads and its rule), so the portal can draw it.
        proposal = booking_proposal(spec, window) if summary.proposal else None
        uuid_of = dict(
            Gpu.objects.filter(pk__in=[g.id for s in summary.servers for g in s.free] + (proposal or [])).values_list(
                "pk", "uuid"
            )
        )
        return Response(
            {
                "start": data["start"],
                "end": data["end"],
                "free_gpus": summary.free_gpus,
                "servers": [
                    {"hostname": s.hostname, "free": [uuid_of[g.id] for g in s.free], "whole": s.whole}
                    for s in sorted(summary.servers, key=lambda s: s.hostname)
                ],
                "proposal": [uuid_of[i] for i in proposal] if proposal else None,
                "mig_profile": None,
            }
        )


class EarliestView(APIView):
    @extend_schema(
        parameters=[EarliestQuerySerializer],
        summary="The earliest window of a given length that the spec fits in, within the next days",
        responses=inline_serializer(
            "EarliestAnswer",
            {
                "found": serializers.BooleanField(),
                "start": serializers.DateTimeField(allow_null=True),
                "end": serializers.DateTimeField(allow_null=True),
                "gpus": serializers.ListField(
                    child=serializers.CharField(), help_text="GPU uuids; MIG device uuids for a slice answer."
                ),
                "mig_profile": serializers.CharField(allow_null=True, help_text=_PROFILE_HELP),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        query = EarliestQuerySerializer(data=query_data(request, EarliestQuerySerializer))
        query.is_valid(raise_exception=True)
        data = query.validated_data
        found = earliest_booking(
            spec_from(data),
            duration=timedelta(hours=float(data["duration_hours"])),
            within=timedelta(days=data["within_days"]),
            now=timezone.now(),
        )
        if found is None:
            return Response({"found": False, "start": None, "end": None, "gpus": [], "mig_profile": None})
        window, ids, profile = found
        return Response(
            {
                "found": True,
                "start": window.starts_at,
                "end": window.ends_at,
                "gpus": _uuids(ids, slices=profile is not None),
                "mig_profile": profile,
            }
        )


class TimelineView(APIView):
    @extend_schema(
        parameters=[TimelineQuerySerializer],
        summary="Per GPU, who holds it over a range (the portal's Gantt view)",
        description="Segments of other tenants' reservations show as busy, without their id.",
        responses=inline_serializer(
            "TimelineAnswer",
            {
                "start": serializers.DateTimeField(),
                "end": serializers.DateTimeField(),
                "count": serializers.IntegerField(),
                "gpus": TimelineGpuSerializer(many=True),
            },
        ),
    )
    def get(self, request: Request) -> Response:
        query = TimelineQuerySerializer(data=query_data(request, TimelineQuerySerializer))
        query.is_valid(raise_exception=True)
        data = query.validated_data
        gpus = Gpu.objects.filter(present=True).exclude(server__state=ServerState.RETIRED)
        if data.get("server"):
            gpus = gpus.filter(server__hostname=data["server"])
        if data.get("gpu_model"):
            gpus = gpus.filter(model=data["gpu_model"])
        gpus = gpus.order_by("server__hostname", "index")
        count = gpus.count()
        page = list(gpus.select_related("server", "model")[data["offset"] : data["offset"] + data["limit"]])
        unavailable = unavailability(page)
        segments = timeline(
            gpus=Gpu.objects.filter(pk__in=[g.pk for g in page]), starts_at=data["start"], ends_at=data["end"]
        )
        visible = set(projects_visible_to(request.user).values_list("pk", flat=True))
        reservation_ids = {s.reservation_id for segs in segments.values() for s in segs if s.project_id in visible}
        public = (
            dict(Reservation.objects.filter(pk__in=reservation_ids).values_list("pk", "public_id"))
            if reservation_ids
            else {}
        )
        slugs = dict(
            projects_visible_to(request.user)
            .filter(pk__in={s.project_id for segs in segments.values() for s in segs if s.project_id in visible})
            .values_list("pk", "slug")
        )
        return Response(
            {
                "start": data["start"],
                "end": data["end"],
                "count": count,
                "gpus": [
                    {
                        "gpu": g.uuid,
                        "server": g.server.hostname,
                        "index": g.index,
                        "gpu_model": g.model.name,
                        "server_state": g.server.state,
                        "health": g.health,
                        "unavailable": (
                            {"reason": unavailable[g.pk].reason, "detail": unavailable[g.pk].detail}
                            if g.pk in unavailable
                            else None
                        ),
                        "segments": [
                            {
                                "starts_at": s.starts_at,
                                "ends_at": s.ends_at,
                                "active": s.active,
                                "mine": s.project_id in visible,
                                "reservation": str(public[s.reservation_id]) if s.project_id in visible else None,
                                "project": slugs.get(s.project_id) if s.project_id in visible else None,
                                "yielding": s.active and s.yielding,
                            }
                            for s in segments.get(g.pk, [])
                        ],
                    }
                    for g in page
                ],
            }
        )
