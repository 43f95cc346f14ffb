from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.api.permissions import IsOperator
from controlplane.accounts.selectors import can_book, projects_visible_to
from controlplane.core.errors import NotFound, PermissionDenied
from controlplane.reservations import hooks as reservation_hooks
from controlplane.scheduling import services
from controlplane.scheduling.api.serializers import (
    FairShareSerializer,
    PriorityClassChangeSerializer,
    PriorityClassSerializer,
    QueuedRequestCancelSerializer,
    QueuedRequestCreateSerializer,
    QueuedRequestDetailSerializer,
    QueuedRequestSerializer,
    QueueEntrySerializer,
)
from controlplane.scheduling.fairshare import half_life
from controlplane.scheduling.filters import QueuedRequestFilter
from controlplane.scheduling.models import PriorityClass, QueuedRequest
from controlplane.scheduling.selectors import (
    classes_allowed_to,
    operator_queue,
    priority_classes,
    project_fair_share,
    requests_visible_to,
)
from controlplane.vault.registry import check_image

_ROLE = "Queueing needs the owner or member role in the project."


@extend_schema_view(
    list=extend_schema(
        summary="The priority classes, the most urgent first, with whether you may submit in each",
        description="What each class costs (`credit_multiplier` times the booking rate), whether its "
        "reservations yield their GPUs (`preemptible`, after `notice_seconds` of notice), and whether it is "
        "restricted. `allowed`: whether you may queue in it for at least one project you own or are a member of "
        "(an operator: every class). Operators edit the classes in the admin; this list is what the pass uses.",
    )
)
class PriorityClassViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The queue's classes (docs/scheduling.md): anyone signed in may read them."""

    serializer_class = PriorityClassSerializer
    pagination_class = None  # a handful of rows, read whole by the portal
    filterset_class = None
    queryset = PriorityClass.objects.none()

    def get_queryset(self) -> QuerySet[PriorityClass]:
        return priority_classes()

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "granted": classes_allowed_to(self.request.user)}


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
            "project", "priority_class", "reservation", "requeued_from", "blocked_by"
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
        project = None
        if isinstance(slug, str):
            # The project and the role before the rest of the body, as for a booking.
            project = projects.filter(slug=slug).first()
            if project is None:
                raise NotFound("No such project among yours.", fields={"project": ["No such project."]})
            if not can_book(request.user, project):
                raise PermissionDenied(_ROLE)
        if isinstance(data, dict) and "template" in data:
            # A launch template written out first (docs/templates.md), as a booking's is.
            data, _ = reservation_hooks.expand_template(data, project=project, queue=True)
        serializer = QueuedRequestCreateSerializer(data=data, projects=projects)
        serializer.is_valid(raise_exception=True)
        args = serializer.to_domain()
        # The image as a booking checks it (docs/images.md); a registry that cannot be reached lets it queue.
        check_image(project=args["project"], image=args["container"].image.strip())
        queued = services.request_submit(actor=request.user, **args)
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

    @extend_schema(
        responses={200: QueueEntrySerializer(many=True)},
        summary="Operators: the whole queue across projects, in the pass's order, with a reason per request",
        description="The queued requests in the order the pass serves them (class, fair share, first come), then "
        "the held ones. `reason` is the last pass's: for one whose GPUs are busy, what it waits for and the "
        "reservation whose end frees them (`blocked_by`, `blocked_until`: its shadow time, ISO 8601). "
        "403 for tenants.",
    )
    # IsOperator (checked before any lookup, so a tenant is told 403 whether or not it may see the request) also
    # puts the 403 in the schema.
    @action(detail=False, methods=["get"], pagination_class=None, filterset_class=None, permission_classes=[IsOperator])
    def queue(self, request: Request) -> Response:
        return Response(QueueEntrySerializer(operator_queue(), many=True).data)

    @extend_schema(
        request=QueuedRequestCancelSerializer,
        responses={200: QueuedRequestDetailSerializer},
        summary="Operators: hold a queued request (the pass skips it until released; 409 `invalid_state` else)",
    )
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def hold(self, request: Request, id: str) -> Response:
        return self._operator_move(request, services.request_hold)

    @extend_schema(
        request=QueuedRequestCancelSerializer,
        responses={200: QueuedRequestDetailSerializer},
        summary="Operators: release a held request back into the queue (409 `invalid_state` unless held)",
    )
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def release(self, request: Request, id: str) -> Response:
        return self._operator_move(request, services.request_release)

    def _operator_move(self, request: Request, move: Any) -> Response:
        queued = self.get_object()
        serializer = QueuedRequestCancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        move(request=queued, actor=request.user, reason=serializer.validated_data["reason"])
        return self._detail(queued.pk)

    @extend_schema(
        request=PriorityClassChangeSerializer,
        responses={200: QueuedRequestDetailSerializer},
        summary="Operators: move a queued or held request to another class (an event; 409 `invalid_state` else)",
    )
    @action(detail=True, methods=["post"], url_path="priority-class", permission_classes=[IsOperator])
    def priority_class(self, request: Request, id: str) -> Response:
        queued = self.get_object()
        serializer = PriorityClassChangeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.request_set_class(
            request=queued,
            priority_class=serializer.validated_data["priority_class"],
            actor=request.user,
            reason=serializer.validated_data["reason"],
        )
        return self._detail(queued.pk)


class ProjectFairShareView(APIView):
    """A project's fair-share standing (docs/scheduling.md, "Fair share"); another tenant's project is 404."""

    @extend_schema(
        responses={200: FairShareSerializer},
        summary="A project's fair share: its decayed usage, its shares and the factor F = 2^(-U/S)",
    )
    def get(self, request: Request, slug: str) -> Response:
        project = projects_visible_to(request.user).filter(slug=slug).first()
        if project is None:
            raise NotFound("No such project among yours.")
        standing = project_fair_share(project.pk)
        data = {
            "project": project.slug,
            "shares": standing.shares,
            "usage_gpu_hours": standing.usage_gpu_hours,
            "normalized_usage": standing.normalized_usage,
            "normalized_shares": standing.normalized_shares,
            "factor": standing.factor,
            "half_life_days": half_life().total_seconds() / 86400,
        }
        return Response(FairShareSerializer(data).data)
