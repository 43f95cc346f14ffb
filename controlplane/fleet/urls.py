"""/metrics for Prometheus and /healthz for load balancers, outside the versioned API."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from rest_framework import exceptions

from controlplane.accounts.authentication import BearerTokenAuthentication
from controlplane.accounts.selectors import is_operator
from controlplane.fleet.metrics import registry


def _metrics_refusal(request: HttpRequest) -> HttpResponse | None:
    if getattr(settings, "METRICS_PUBLIC", True):
        return None
    if is_operator(getattr(request, "user", None)):
        return None
    try:
        result = BearerTokenAuthentication().authenticate(request)
    except exceptions.AuthenticationFailed as exc:
        return HttpResponse(f"{exc.detail}\n", status=401, content_type="text/plain")
    if result is None:
        response = HttpResponse("A bearer token of an operator is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    if not is_operator(result[0]):
        return HttpResponse("Only operators may read the metrics.\n", status=403, content_type="text/plain")
    return None


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = _metrics_refusal(request)
    if refusal is not None:
        return refusal
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return JsonResponse({"status": "error", "database": str(exc)[:200]}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})


urlpatterns = [
    path("metrics", metrics, name="metrics"),
    path("healthz", healthz, name="healthz"),
]
