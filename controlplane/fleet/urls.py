"""/metrics for Prometheus; /livez, /readyz and /healthz for probes and load balancers; outside the versioned
API. What the probes check, and why only the database makes the process unready: controlplane/core/health.py."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.http import require_GET, require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from rest_framework import exceptions

from controlplane.accounts.authentication import BearerTokenAuthentication
from controlplane.accounts.selectors import is_operator
from controlplane.core.health import readiness
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


@require_safe
def livez(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. No dependency is asked (see controlplane/core/health.py)."""
    return JsonResponse({"status": "ok"})


@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 while the database answers (``degraded`` when the cache or the broker does not), else 503;
    each dependency is named with its state."""
    ready, body = readiness()
    return JsonResponse(body, status=200 if ready else 503)


urlpatterns = [
    path("metrics", metrics, name="metrics"),
    path("livez", livez, name="livez"),
    path("readyz", readyz, name="readyz"),
    # The load balancers' and compose's probe since the start: readiness under its older name.
    path("healthz", readyz, name="healthz"),
]
