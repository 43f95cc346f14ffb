from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.accounting.api.reclaim import ReservationIdleView, ReservationKeepView
from controlplane.accounting.api.telemetry import ReservationTelemetryView
from controlplane.accounting.api.views import (
    EfficiencyRankingView,
    EfficiencyStatementView,
    FleetReportView,
    ProjectReportView,
    StatementViewSet,
    TimeseriesView,
    UsageRecordViewSet,
)

router = SimpleRouter()
router.register("usage/records", UsageRecordViewSet, basename="usage-record")
router.register("usage/statements", StatementViewSet, basename="usage-statement")

urlpatterns = [
    path("usage/report", ProjectReportView.as_view(), name="usage-report"),
    path("usage/report.<str:format>", ProjectReportView.as_view(), name="usage-report-format"),
    path("usage/fleet", FleetReportView.as_view(), name="usage-fleet"),
    path("usage/fleet.<str:format>", FleetReportView.as_view(), name="usage-fleet-format"),
    path("usage/efficiency", EfficiencyStatementView.as_view(), name="usage-efficiency"),
    path("usage/efficiency.<str:format>", EfficiencyStatementView.as_view(), name="usage-efficiency-format"),
    path("usage/efficiency-ranking", EfficiencyRankingView.as_view(), name="usage-efficiency-ranking"),
    path(
        "usage/efficiency-ranking.<str:format>", EfficiencyRankingView.as_view(), name="usage-efficiency-ranking-format"
    ),
    path("usage/timeseries", TimeseriesView.as_view(), name="usage-timeseries"),
    path("reservations/<uuid:id>/telemetry/", ReservationTelemetryView.as_view(), name="reservation-telemetry"),
    path("reservations/<uuid:id>/keep/", ReservationKeepView.as_view(), name="reservation-keep"),
    path("reservations/<uuid:id>/idle/", ReservationIdleView.as_view(), name="reservation-idle"),
    *router.urls,
]
