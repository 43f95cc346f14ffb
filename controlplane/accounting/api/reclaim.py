"""POST /api/v1/reservations/<id>/keep/: answer an idle warning (docs/efficiency.md, "Idle reclamation")."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounting import reclaim
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
