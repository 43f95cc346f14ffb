from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.selectors import can_book, projects_visible_to
from controlplane.core.errors import NotFound, PermissionDenied
from controlplane.scheduling import services
from controlplane.scheduling.api.serializers import (
    QueuedRequestCancelSerializer,
    QueuedRequestCreateSerializer,
    QueuedRequestDetailSerializer,
    QueuedRequestSerializer,
)
from controlplane.scheduling.filters import QueuedRequestFilter
from controlplane.scheduling.models import QueuedRequest
from controlplane.scheduling.selectors import requests_visible_to

_ROLE = "Queueing needs the owner or member role in the project."


class QueuedRequestViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Queued requests of the projects you belong to (docs/scheduling.md). Another project's request is 404."""

    schema_error_statuses = {"POST": ("404",)}  # a body naming a project not the caller's (core/api/schema.py)
    serializer_class = QueuedRequestSerializer
    filterset_class = QueuedRequestFilter
    lookup_field = "public_id"
    lookup_url_kwarg = "id"
    lookup_value_regex = "[0-9a-fA-F-]{36}"
    queryset = QueuedRequest.objects.none()

    def get_queryset(self) -> QuerySet[QueuedRequest]:
        qs = requests_visible_to(self.request.user).select_related(
            "project", "priority_class", "reservation", "requeued_from"
        )
        if self.action != "list":
            qs = qs.prefetch_related("events")
        return qs

    def get_serializer_class(self) -> type:
        return QueuedRequestSerializer if self.action == "list" else QueuedRequestDetailSerializer

    def _detail(self, request_id: int, code: int = status.HTTP_200_OK) -> Response:
        fresh = self.get_queryset().get(pk=request_id)
        return Response(QueuedRequestDetailSerializer(fresh, context=self.get_serializer_context()).data, status=code)

    @extend_schema(
        request=QueuedRequestCreateSerializer,
        responses={201: QueuedRequestDetailSerializer},
        summary="Queue a request: it starts when its GPUs are free",
        description="Nothing is booked and no credits are held while it waits; the queue pass books it through "
        "the booking service as soon as the GPUs are free. 409 `no_capacity` when the fleet has fewer matching "
        "GPUs than asked for, so it could never start; 409 `quota_exceeded` when the project's quota rules it "
        "out (the longest booking, the concurrency cap, or the credits it has now).",
    )
    def create(self, request: Request) -> Response:
        data: Any = request.data
        slug = data.get("project") if isinstance(data, dict) else None
        projects = projects_visible_to(request.user)
        if isinstance(slug, str):
            # The project and the role before the rest of the body, as for a booking.
            project = projects.filter(slug=slug).first()
            if project is None:
                raise NotFound("No such project among yours.", fields={"project": ["No such project."]})
            if not can_book(request.user, project):
                raise PermissionDenied(_ROLE)
        serializer = QueuedRequestCreateSerializer(data=data, projects=projects)
        serializer.is_valid(raise_exception=True)
        queued = services.request_submit(actor=request.user, **serializer.to_domain())
        return self._detail(queued.pk, status.HTTP_201_CREATED)

    @extend_schema(
        request=QueuedRequestCancelSerializer,
        responses={200: QueuedRequestDetailSerializer},
        summary="Take a queued request off the queue (409 `invalid_state` once it started or ended)",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, id: str) -> Response:
        queued = self.get_object()
        if not can_book(request.user, queued.project_id):
            raise PermissionDenied(_ROLE)
        serializer = QueuedRequestCancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.request_cancel(request=queued, actor=request.user, reason=serializer.validated_data["reason"])
        return self._detail(queued.pk)
