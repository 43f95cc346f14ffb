from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.api.permissions import IsOperator
from controlplane.accounts.models import Project
from controlplane.accounts.selectors import can_manage, projects_visible_to
from controlplane.core.errors import NotFound, PermissionDenied
from controlplane.ledger import budgets, services
from controlplane.ledger.api.serializers import (
    AdjustSerializer,
    BalanceSerializer,
    BudgetAlertSerializer,
    BudgetStatusSerializer,
    GrantSerializer,
    LedgerEntrySerializer,
    MemberCapSerializer,
    MemberCapSetSerializer,
    QuotaPolicySerializer,
    RefundSerializer,
)
from controlplane.ledger.filters import BudgetAlertFilter, LedgerEntryFilter, MemberCapFilter
from controlplane.ledger.models import BudgetAlert, LedgerEntry, MemberCap, QuotaPolicy
from controlplane.ledger.selectors import LedgerTotals, ledger_totals, totals_for_projects


class LedgerEntryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The append-only ledger of the projects you belong to."""

    serializer_class = LedgerEntrySerializer
    filterset_class = LedgerEntryFilter
    queryset = LedgerEntry.objects.none()

    def get_queryset(self) -> QuerySet[LedgerEntry]:
        return LedgerEntry.objects.filter(project__in=projects_visible_to(self.request.user)).select_related(
            "project", "reservation"
        )


def _balance(project: Project, totals: LedgerTotals) -> dict[str, Any]:
    return {"project": project.slug, "balance": totals.balance, "held": totals.held, "by_kind": dict(totals.by_kind)}


class BalanceViewSet(viewsets.ViewSet):
    """Balances: the sum of each project's ledger entries."""

    lookup_field = "slug"
    serializer_class = BalanceSerializer

    @extend_schema(responses=BalanceSerializer(many=True))
    def list(self, request: Request) -> Response:
        projects = list(projects_visible_to(request.user).order_by("slug")[:500])
        totals = totals_for_projects(p.pk for p in projects)
        return Response(BalanceSerializer([_balance(p, totals[p.pk]) for p in projects], many=True).data)

    @extend_schema(
        responses=BalanceSerializer,
        parameters=[OpenApiParameter("slug", str, OpenApiParameter.PATH, description="Project slug.")],
    )
    def retrieve(self, request: Request, slug: str) -> Response:
        project = get_object_or_404(projects_visible_to(request.user), slug=slug)
        return Response(BalanceSerializer(_balance(project, ledger_totals(project_id=project.pk))).data)


class QuotaPolicyViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin, viewsets.GenericViewSet
):
    """Quota policies: members read their projects'; operators set them."""

    serializer_class = QuotaPolicySerializer
    lookup_field = "project__slug"
    lookup_url_kwarg = "slug"
    queryset = QuotaPolicy.objects.none()

    def get_permissions(self) -> list[BasePermission]:
        if self.action in ("update", "partial_update"):
            return [IsAuthenticated(), IsOperator()]
        return [IsAuthenticated()]

    def get_queryset(self) -> QuerySet[QuotaPolicy]:
        return (
            QuotaPolicy.objects.filter(project__in=projects_visible_to(self.request.user))
            .select_related("project", "updated_by")
            .order_by("project__slug")
        )

    def get_object(self) -> QuotaPolicy:
        project = get_object_or_404(projects_visible_to(self.request.user), slug=self.kwargs["slug"])
        policy, _ = QuotaPolicy.objects.get_or_create(project=project)
        self.check_object_permissions(self.request, policy)
        return policy

    def perform_update(self, serializer: Any) -> None:
        policy: QuotaPolicy = serializer.instance
        data = serializer.validated_data
        serializer.instance = services.quota_policy_set(
            project=policy.project,
            actor=self.request.user,
            credits_per_period=data.get("credits_per_period"),
            max_concurrent_gpus=data.get("max_concurrent_gpus"),
            max_reservation_hours=data.get("max_reservation_hours"),
            budget_credits=data.get("budget_credits"),
            budget_action=data.get("budget_action"),
            idle_util_percent=data.get("idle_util_percent"),
            idle_minutes=data.get("idle_minutes"),
            idle_grace_minutes=data.get("idle_grace_minutes"),
            fields=set(data),
        )


class _OperatorMove(APIView):
    """An operator's ledger entry: validate ``input_class``, call ``move`` with the caller as actor, 201."""

    permission_classes = [IsAuthenticated, IsOperator]
    input_class: type = GrantSerializer
    move: Callable[..., LedgerEntry] = staticmethod(services.ledger_grant)

    def post(self, request: Request) -> Response:
        s = self.input_class(data=request.data)
        s.is_valid(raise_exception=True)
        entry = self.move(actor=request.user, **s.validated_data)
        return Response(LedgerEntrySerializer(entry).data, status=status.HTTP_201_CREATED)


def _documented(request: type, summary: str) -> Any:
    return extend_schema_view(post=extend_schema(request=request, responses={201: LedgerEntrySerializer},
                                                 summary=summary))  # fmt: skip


@_documented(GrantSerializer, "Grant credits to a project (operators)")
class GrantView(_OperatorMove):
    input_class = GrantSerializer
    move = staticmethod(services.ledger_grant)


@_documented(AdjustSerializer, "Adjust a project's credits, either sign (operators)")
class AdjustView(_OperatorMove):
    input_class = AdjustSerializer
    move = staticmethod(services.ledger_adjust)


@_documented(RefundSerializer, "Refund credits charged for a reservation (operators)")
class RefundView(_OperatorMove):
    input_class = RefundSerializer
    move = staticmethod(services.ledger_refund)


class BudgetAlertViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Budget thresholds (80, 95, 100 %) the projects you belong to crossed, once per period each."""

    serializer_class = BudgetAlertSerializer
    filterset_class = BudgetAlertFilter
    queryset = BudgetAlert.objects.none()

    def get_queryset(self) -> QuerySet[BudgetAlert]:
        return BudgetAlert.objects.filter(project__in=projects_visible_to(self.request.user)).select_related(
            "project", "reservation"
        )


class BudgetStatusView(APIView):
    """A project's budget this period: the cap, its action, what is spent or held, and the alerts so far."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        responses=BudgetStatusSerializer,
        parameters=[OpenApiParameter("slug", str, OpenApiParameter.PATH, description="Project slug.")],
    )
    def get(self, request: Request, slug: str) -> Response:
        project = get_object_or_404(projects_visible_to(request.user), slug=slug)
        return Response(BudgetStatusSerializer(budgets.status(project_id=project.pk)).data)


class MemberCapViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Per-member GPU-hour caps: members read their projects'; the project's owners and operators set them."""

    serializer_class = MemberCapSerializer
    filterset_class = MemberCapFilter
    queryset = MemberCap.objects.none()
    # A body naming a project not the caller's or a user who is not its member (404), or a project the caller
    # only belongs to (403).
    schema_error_statuses = {"POST": ("403", "404")}

    def get_queryset(self) -> QuerySet[MemberCap]:
        return (
            MemberCap.objects.filter(project__in=projects_visible_to(self.request.user))
            .select_related("project", "user")
            .order_by("project__slug", "user__username")
        )

    @extend_schema(
        request=MemberCapSetSerializer,
        responses={200: MemberCapSerializer, 204: None},
        summary="Set a member's GPU-hour cap (owners, operators); a null cap removes it",
    )
    def create(self, request: Request) -> Response:
        from django.contrib.auth import get_user_model

        data: Any = request.data
        slug = data.get("project") if isinstance(data, dict) else None
        if isinstance(slug, str):
            # Before the rest of the body: another tenant's project reads as absent, a teammate is refused.
            target = projects_visible_to(request.user).filter(slug=slug).first()
            if target is None:
                raise NotFound("No such project among yours.", fields={"project": ["No such project."]})
            if not can_manage(request.user, target):
                raise PermissionDenied("Only the project's owners and operators set members' caps.")
        s = MemberCapSetSerializer(data=data)
        s.fields["project"].queryset = projects_visible_to(request.user)  # type: ignore[attr-defined]
        s.is_valid(raise_exception=True)
        project = s.validated_data["project"]
        name = s.validated_data["user"]
        # A cap is on one of the project's members: anyone else is absent from where the cap would be, a 404
        # naming the field as for the project itself (a 400 would refuse a request the schema admits).
        user = get_user_model().objects.filter(username=name, memberships__project=project).first()
        if user is None:
            message = f"{name} is not a member of {project.slug}."
            raise NotFound(f"user: {message}", fields={"user": [message]})
        hours = s.validated_data["gpu_hours_per_period"]
        cap = services.member_cap_set(project=project, user=user, gpu_hours_per_period=hours, actor=request.user)
        if cap is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        cap.project, cap.user = project, user
        return Response(MemberCapSerializer(cap).data)
