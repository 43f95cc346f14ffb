"""A reservation's idle reclamation: GET .../idle/ (what the portal's banner shows) and POST .../keep/
(answer the warning). docs/efficiency.md, "Idle reclamation"."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounting import reclaim
from controlplane.accounting.models import IdleReclamation
from controlplane.accounts.selectors import can_book
from controlplane.core.errors import NotFound, PermissionDenied
from controlplane.reservations.api.serializers import ReservationDetailSerializer
from controlplane.reservations.selectors import reservations_visible_to


class ReservationKeepView(APIView):
    """Keep a reservation an idle warning cut short: its booked end comes back, and it is not reclaimed again."""

    schema_error_statuses = {"POST": ("404", "409")}

    @extend_schema(
        request=None,
        responses={200: ReservationDetailSerializer},
        summary="Keep it: withdraw an idle warning and restore the booked end",
        description="For the project's owners and members. 409 `nothing_to_keep` when no idle warning is "
        "pending (none, kept already, or the grace has ended); 409 `gpu_taken` when someone booked the freed "
        "GPUs meanwhile; quota refusals as for an extension.",
    )
    def post(self, request: Request, id: Any) -> Response:
        reservation = reservations_visible_to(request.user).filter(public_id=id).first()
        if reservation is None:
            raise NotFound("No such reservation among yours.")
        if not can_book(request.user, reservation.project_id):
            raise PermissionDenied("Keeping a reservation needs the owner or member role in the project.")
        kept = reclaim.idle_keep(reservation=reservation, actor=request.user)
        from controlplane.reservations.api.views import ReservationViewSet

        view = ReservationViewSet(request=request, format_kwarg=None, action="retrieve", kwargs={})
        return view._detail(kept)


class IdleReclamationSerializer(serializers.ModelSerializer):
    kept_by = serializers.CharField(source="kept_by.username", default=None, allow_null=True, read_only=True)
    reclaimed_gpu_hours = serializers.FloatField(read_only=True)

    class Meta:
        model = IdleReclamation
        fields = [
            "state",
            "warned_at",
            "util_percent",
            "threshold_percent",
            "idle_minutes",
            "booked_ends_at",
            "cut_ends_at",
            "kept_at",
            "kept_by",
            "reclaimed_at",
            "reclaimed_gpu_hours",
        ]


class IdleAnswerSerializer(serializers.Serializer):
    idle = IdleReclamationSerializer(allow_null=True, help_text="Null when the reservation was never found idle.")


class ReservationIdleView(APIView):
    """Whether the reservation was found idle, and where that stands: warned (keep it before ``cut_ends_at``),
    kept, or reclaimed. For the project's members (viewers too) and operators."""

    schema_error_statuses = {"GET": ("404",)}

    @extend_schema(responses={200: IdleAnswerSerializer}, summary="The reservation's idle warning, if any")
    def get(self, request: Request, id: Any) -> Response:
        reservation = reservations_visible_to(request.user).filter(public_id=id).first()
        if reservation is None:
            raise NotFound("No such reservation among yours.")
        found = IdleReclamation.objects.select_related("kept_by").filter(reservation=reservation).first()
        return Response({"idle": None if found is None else IdleReclamationSerializer(found).data})
