from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounting import efficiency, selectors
from controlplane.accounting.api.renderers import ReportCSVRenderer
from controlplane.accounting.api.serializers import (
    EfficiencyQuerySerializer,
    EfficiencyRankingSerializer,
    EfficiencyStatementSerializer,
    FleetReportQuerySerializer,
    ProjectEfficiencyQuerySerializer,
    ProjectReportQuerySerializer,
    ReportSerializer,
    StatementSerializer,
    TimeseriesPointSerializer,
    TimeseriesQuerySerializer,
    UsageRecordSerializer,
)
from controlplane.accounting.models import MonthlyStatement, UsageRecord
from controlplane.accounts.api.permissions import IsOperator
from controlplane.accounts.models import Project
from controlplane.accounts.selectors import is_operator, projects_visible_to
from controlplane.core.api.query import query_data
from controlplane.core.errors import PermissionDenied

RENDERERS = [JSONRenderer, ReportCSVRenderer, BrowsableAPIRenderer]


def _query(serializer_class: type, request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=query_data(request, serializer_class))
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data  # type: ignore[no-any-return]


def _visible_project(request: Request, slug: str) -> Project:
    # Another tenant's project answers exactly like one that does not exist.
    return get_object_or_404(projects_visible_to(request.user), slug=slug)


def _csv_name(response: Response, request: Request, name: str) -> Response:
    if getattr(request, "accepted_renderer", None) and request.accepted_renderer.format == "csv":
        response["Content-Disposition"] = f'attachment; filename="{name}.csv"'
    return response


class ProjectReportView(APIView):
    """A project's usage over a range, split by user, GPU model, day or reservation. ``?format=csv`` or
    ``/report.csv`` gives the same rows as CSV. Any member (viewers too) may read it."""

    renderer_classes = RENDERERS
    schema_error_statuses = ("404",)  # ?project= naming none of the caller's (controlplane/core/api/schema.py)

    @extend_schema(parameters=[ProjectReportQuerySerializer], responses=ReportSerializer)
    def get(self, request: Request, format: str | None = None) -> Response:
        query = _query(ProjectReportQuerySerializer, request)
        project = _visible_project(request, query["project"])
        report = selectors.project_report(
            project=project, start=query["start"], end=query["end"], group_by=query["group_by"]
        )
        response = Response(ReportSerializer(report.as_dict()).data)
        return _csv_name(response, request, f"usage-{project.slug}-{query['start']:%Y%m%d%H}-{query['end']:%Y%m%d%H}")


class FleetReportView(APIView):
    """Operators: the fleet's usage by project (unheld GPUs in their own row), GPU model or day."""

    permission_classes = [IsOperator]
    renderer_classes = RENDERERS

    @extend_schema(parameters=[FleetReportQuerySerializer], responses=ReportSerializer)
    def get(self, request: Request, format: str | None = None) -> Response:
        query = _query(FleetReportQuerySerializer, request)
        report = selectors.fleet_report(start=query["start"], end=query["end"], group_by=query["group_by"])
        response = Response(ReportSerializer(report.as_dict()).data)
        return _csv_name(response, request, f"fleet-usage-{query['start']:%Y%m%d%H}-{query['end']:%Y%m%d%H}")


class EfficiencyStatementView(APIView):
    """A project's efficiency statement for a UTC month, beside its previous month and the fleet
    (docs/efficiency.md). ``/efficiency.csv`` or ``?format=csv``: the ranked reservations and the three totals."""

    renderer_classes = RENDERERS
    schema_error_statuses = ("404",)

    @extend_schema(parameters=[ProjectEfficiencyQuerySerializer], responses=EfficiencyStatementSerializer)
    def get(self, request: Request, format: str | None = None) -> Response:
        query = _query(ProjectEfficiencyQuerySerializer, request)
        project = _visible_project(request, query["project"])
        data = efficiency.statement(project=project, month=query["month"])
        response = Response(EfficiencyStatementSerializer(data).data)
        return _csv_name(response, request, f"efficiency-{project.slug}-{data['period']}")


class EfficiencyRankingView(APIView):
    """Operators: every project's efficiency in a UTC month, ranked by waste."""

    permission_classes = [IsOperator]
    renderer_classes = RENDERERS

    @extend_schema(parameters=[EfficiencyQuerySerializer], responses=EfficiencyRankingSerializer)
    def get(self, request: Request, format: str | None = None) -> Response:
        query = _query(EfficiencyQuerySerializer, request)
        data = efficiency.ranking(month=query["month"])
        response = Response(EfficiencyRankingSerializer(data).data)
        return _csv_name(response, request, f"efficiency-ranking-{data['period']}")


class TimeseriesView(APIView):
    """Per hour or day, for charts: held, used and idle GPU-hours, mean utilization, energy. A project's, or
    (operators, no ``project``) the fleet's."""

    # A tenant asking for the fleet; ?project= naming none of the caller's (controlplane/core/api/schema.py).
    schema_error_statuses = ("403", "404")

    @extend_schema(parameters=[TimeseriesQuerySerializer], responses=TimeseriesPointSerializer(many=True))
    def get(self, request: Request) -> Response:
        query = _query(TimeseriesQuerySerializer, request)
        project = _visible_project(request, query["project"]) if query.get("project") else None
        if project is None and not is_operator(request.user):
            raise PermissionDenied(
                "project: give a project; only operators may see the whole fleet.",
                fields={"project": ["This field is required."]},
            )
        points = selectors.timeseries(start=query["start"], end=query["end"], bucket=query["bucket"], project=project)
        return Response(TimeseriesPointSerializer(points, many=True).data)


class UsageRecordViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """What each GPU of each finished reservation was booked for, ran and was charged."""

    serializer_class = UsageRecordSerializer
    queryset = UsageRecord.objects.none()

    def get_queryset(self) -> QuerySet[UsageRecord]:
        qs = selectors.usage_records_visible_to(self.request.user).order_by("-booked_start", "-id")
        slug = self.request.query_params.get("project")
        return qs.filter(project__slug=slug) if slug else qs


class StatementViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Monthly statements, generated after each month closes; ``/csv/`` downloads one."""

    serializer_class = StatementSerializer
    queryset = MonthlyStatement.objects.none()

    def get_queryset(self) -> QuerySet[MonthlyStatement]:
        qs = selectors.statements_visible_to(self.request.user)
        slug = self.request.query_params.get("project")
        return qs.filter(project__slug=slug) if slug else qs

    @extend_schema(responses={(200, "text/csv"): str})
    @action(detail=True, methods=["get"], url_path="csv")
    def download_csv(self, request: Request, pk: str | None = None) -> HttpResponse:
        statement = self.get_object()
        response = HttpResponse(statement.csv, content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = (
            f'attachment; filename="statement-{statement.project.slug}-{statement.period_key}.csv"'
        )
        return response
