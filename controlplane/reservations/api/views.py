from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.choices import BOOKING_ROLES
from controlplane.accounts.selectors import can_book, is_operator, projects_visible_to
from controlplane.core.api.fields import DATE_TIME_SCHEMA
from controlplane.core.errors import NotFound, PermissionDenied
from controlplane.inventory.selectors import mig_weight_overrides
from controlplane.reservations import hooks, services
from controlplane.reservations.api.serializers import (
    ExtendQuoteQuerySerializer,
    ExtendQuoteSerializer,
    ExtendSerializer,
    ReservationCreateSerializer,
    ReservationDetailSerializer,
    ReservationReasonSerializer,
    ReservationSerializer,
    read_booking,
    reservation_detail,
)
from controlplane.reservations.costs import with_charges
from controlplane.reservations.filters import ReservationFilter
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.selectors import booking_target, reservations_visible_to
from controlplane.vault.registry import check_image


def _require_booking_role(user: Any, project_id: int) -> None:
    if not can_book(user, project_id):
        raise PermissionDenied("Booking needs the owner or member role in the project.")


class ReservationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    schema_error_statuses = {"POST": ("404",)}  # a body naming a project not the caller's (core/api/schema.py)
    """Reservations of the projects you belong to. Another project's reservation is 404."""

    serializer_class = ReservationSerializer
    filterset_class = ReservationFilter
    lookup_field = "public_id"
    lookup_url_kwarg = "id"
    lookup_value_regex = "[0-9a-fA-F-]{36}"
    queryset = Reservation.objects.none()

    def get_queryset(self) -> QuerySet[Reservation]:
        qs = reservations_visible_to(self.request.user).select_related(
            "project", "gpu_model", "created_by", "preempted_by"
        )
        # Every answer carries its cost: the allocations' GPU models and what the ledger charged.
        qs = with_charges(qs).prefetch_related(
            Prefetch(
                "allocations", queryset=Allocation.objects.select_related("gpu__server", "gpu__model", "mig_device")
            ),
            # What a slice's cost reads (costs.weight): the operators' MIG weight overrides, in one read.
            Prefetch("allocations__gpu__model__mig_profiles", queryset=mig_weight_overrides()),
        )
        if self.action != "list":
            qs = qs.prefetch_related("events")
        return qs

    def http_method_not_allowed(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # DELETE is what most APIs call cancelling; here it is a command with a reason, so say where it is.
        if request.method == "DELETE" and "id" in kwargs:
            cancel = f"POST /api/v1/reservations/{kwargs['id']}/cancel/"
            raise MethodNotAllowed(
                "DELETE", detail=f"A reservation is not deleted: cancel it with {cancel} (an optional reason)."
            )
        return super().http_method_not_allowed(request, *args, **kwargs)

    def get_serializer_class(self) -> type:
        return ReservationSerializer if self.action == "list" else ReservationDetailSerializer

    def _detail(self, reservation: Reservation, code: int = status.HTTP_200_OK) -> Response:
        fresh = self.get_queryset().get(pk=reservation.pk)
        # What the command was told and let through (an extension past a budget that warns) is not stored.
        fresh.warnings = getattr(reservation, "warnings", [])  # type: ignore[attr-defined]
        return Response(ReservationDetailSerializer(fresh, context=self.get_serializer_context()).data, status=code)

    @extend_schema(
        request=ReservationCreateSerializer,
        responses={201: ReservationDetailSerializer},
        summary="Book GPUs for a window",
        description="Places the request, checks the project's quota and holds its credits, all or "
        "nothing. 409 `no_capacity`/`gpu_taken` when the GPUs are not free, 409 "
        "`quota_exceeded` naming the quota, the need and what is left. The image is checked at its registry "
        "with the project's credentials where the installation verifies images: 400 naming `container.image` "
        "when it is not found or the credentials are refused, a warning `image_not_checked` when the registry "
        "cannot be reached (docs/images.md). With `template` (docs/templates.md) the template's container, spec "
        "and window length fill what the request leaves out.",
    )
    def create(self, request: Request) -> Response:
        data: Any = request.data
        slug = data.get("project") if isinstance(data, dict) else None
        target = None
        if isinstance(slug, str):
            spec = data.get("spec")
            model_name = spec.get("gpu_model") if isinstance(spec, dict) else None
            # One read answers "is it yours?", "may you book in it?" and "which GPU model is that?".
            target = booking_target(
                request.user, slug=slug, gpu_model=model_name if isinstance(model_name, str) else None
            )
            if target is None:
                # Another tenant's project reads as absent, never as "forbidden": that would confirm it exists.
                # Nor does the answer repeat the slug: a missing and a foreign project get the same bytes.
                raise NotFound("No such project among yours.", fields={"project": ["No such project."]})
            # The role before the rest of the body: a viewer is refused whatever else the request holds.
            if not (is_operator(request.user) or target.role in BOOKING_ROLES):
                raise PermissionDenied("Booking needs the owner or member role in the project.")
        template = ""
        if isinstance(data, dict) and "template" in data:
            # A template is written out into the request first, so the one reading below judges the result.
            data, template = hooks.expand_template(data, project=None if target is None else target.project)
            if target is not None and target.gpu_model is not None:
                spec = data.get("spec")
                if not isinstance(spec, dict) or spec.get("gpu_model") != target.gpu_model.name:
                    target = replace(target, gpu_model=None)  # the template's model: the field reads it
        # The one reading of a booking (ReservationCreateSerializer), given what that read found.
        if target is None:
            args = read_booking(data, projects=projects_visible_to(request.user))
        else:
            args = read_booking(data, project=target.project, gpu_model=target.gpu_model)
        # The image: syntax and the allow-list, then (IMAGES_CHECK_AT_BOOKING "verify") a manifest request with the
        # project's credentials, before any lock is taken; a registry that does not answer is a warning.
        image_warnings = check_image(project=args["project"], image=args["container"].image.strip())
        reservation = services.reservation_create(actor=request.user, template=template, **args)
        if image_warnings:
            reservation.warnings = [*image_warnings, *getattr(reservation, "warnings", [])]  # type: ignore[attr-defined]
        # The service hands back the reservation with its allocations and events: no need to read it again.
        return Response(reservation_detail(reservation), status=status.HTTP_201_CREATED)

    @extend_schema(
        request=ReservationReasonSerializer,
        responses={200: ReservationDetailSerializer},
        summary="Cancel: before the window everything is released; during it, the window ends now",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, id: str) -> Response:
        return self._command(request, services.reservation_cancel)

    @extend_schema(
        request=ReservationReasonSerializer,
        responses={200: ReservationDetailSerializer},
        summary="Release the GPUs now (ends the window early)",
    )
    @action(detail=True, methods=["post"])
    def release(self, request: Request, id: str) -> Response:
        return self._command(request, services.reservation_release)

    @extend_schema(
        request=ExtendSerializer,
        responses={200: ReservationDetailSerializer},
        summary="Extend the window on the same GPUs, if they are free and the quota allows",
        description="Holds the extra credits. 409 `gpu_taken` when one of its GPUs is booked in the added "
        "time, 409 `quota_exceeded`/`budget_exceeded`/`member_cap_exceeded` naming the quota, the need and "
        "what is left. Past a budget whose action is `warn` the extension is made and its answer carries "
        "`warnings`, as a booking's does.",
    )
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, id: str) -> Response:
        reservation = self.get_object()
        _require_booking_role(request.user, reservation.project_id)
        serializer = ExtendSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        updated = services.reservation_extend(
            reservation=reservation,
            ends_at=serializer.validated_data["ends_at"],
            actor=request.user,
            reason=serializer.validated_data["reason"],
        )
        return self._detail(updated)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "ends_at",
                type=DATE_TIME_SCHEMA,
                required=True,
                description="The new end to price (ISO 8601 with a zone).",
            )
        ],
        responses={200: ExtendQuoteSerializer},
        summary="Price an extension and say whether it would be accepted now; changes nothing",
        description="The same rule as POST .../extend/: the GPUs free for the added time, the quota. A "
        "refusal is in the answer (`allowed: false`, `refusal`), not an error; a malformed `ends_at` is a 400.",
    )
    @action(detail=True, methods=["get"], url_path="extend-quote")
    def extend_quote(self, request: Request, id: str) -> Response:
        reservation = self.get_object()
        query = ExtendQuoteQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        quote = services.extend_quote(reservation=reservation, ends_at=query.validated_data["ends_at"])
        return Response(ExtendQuoteSerializer(quote).data)

    def _command(self, request: Request, service: Any) -> Response:
        reservation = self.get_object()
        _require_booking_role(request.user, reservation.project_id)
        serializer = ReservationReasonSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        updated = service(reservation=reservation, actor=request.user, reason=serializer.validated_data["reason"])
        return self._detail(updated)
