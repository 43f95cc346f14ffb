"""One error shape across the API.

    {"error": {"code": "validation_error", "message": "spec.gpu_count: Ensure this value is ...",
               "fields": {"spec.gpu_count": ["Ensure this value is greater than or equal to 1."]}}}

``message`` is a sentence a person understands; ``fields`` maps dotted field paths to their messages.

Under /api/ nothing else is ever answered: DRF's errors go through ``exception_handler``; Django's own (a URL
that matches nothing, a request it refuses before any view, a crash) through ``handler400`` ... ``handler500``
(controlplane/urls.py) and ``csrf_failure`` (CSRF_FAILURE_VIEW); the pages Django writes itself under DEBUG,
which bypass the handlers, are given this shape by ``ApiGuardMiddleware`` (controlplane/core/api/middleware.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.views import csrf, defaults
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.core.api.parsers import field_label
from controlplane.core.errors import DomainError


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Turn DRF's nested error detail into {"a.b.0.c": ["message", ...]}."""
    out: dict[str, list[str]] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("non_field_errors", "__all__"):
                    walk(value, path)
                else:
                    walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, list) and any(isinstance(item, (dict, list)) for item in node):
            for index, item in enumerate(node):
                if item:
                    walk(item, f"{path}.{index}" if path else str(index))
        elif isinstance(node, list):
            for item in node:
                out.setdefault(path or "non_field_errors", []).append(str(item))
        else:
            out.setdefault(path or "non_field_errors", []).append(str(node))

    walk(detail, prefix)
    return out


def error_body(
    code: str, message: str, fields: dict[str, list[str]] | None = None, extra: dict[str, object] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message, "fields": fields or {}}
    if extra:
        body.update(extra)
    return {"error": body}


def _summary(fields: dict[str, list[str]]) -> str:
    parts = []
    for name, messages in fields.items():
        label = "" if name == "non_field_errors" else f"{name}: "
        parts.append(label + " ".join(messages))
    return "; ".join(parts) or "The request is not valid."


API_PREFIX = "/api/"

# What Django's own refusals are called in the shape, by status: (code, message).
STATUS_ERRORS: dict[int, tuple[str, str]] = {
    400: ("bad_request", "The request is not valid."),
    401: ("not_authenticated", "Authentication credentials were not provided."),
    403: ("permission_denied", "You do not have permission to perform this action."),
    404: ("not_found", "Not found."),
    405: ("method_not_allowed", "This method is not allowed here."),
    413: ("request_too_large", "The request is too large."),
    414: ("uri_too_long", "The path and query string are too long."),
    500: ("server_error", "The server failed to answer; the failure is logged. Retry later."),
}


def is_api_path(path: str) -> bool:
    return path.startswith(API_PREFIX)


def error_response(body: dict[str, Any], status_code: int) -> HttpResponse:
    """An error no DRF view answered, rendered as DRF renders its own: a 404 for a path that matches nothing
    is byte for byte the 404 for an object that is not yours."""
    return HttpResponse(JSONRenderer().render(body), status=status_code, content_type="application/json")


def status_error(
    status_code: int, message: str | None = None, fields: dict[str, list[str]] | None = None
) -> HttpResponse:
    """The shape for a refusal that no view wrote, by its HTTP status."""
    default_code, default_message = STATUS_ERRORS.get(
        status_code, ("server_error" if status_code >= 500 else "bad_request", "The request failed.")
    )
    return error_response(error_body(default_code, message or default_message, fields), status_code)


def database_unavailable(message: str) -> HttpResponse:
    """503 ``database_unavailable``: the database failed, or could not be reached, while the request ran, so
    nothing of it may be taken as done; ``Retry-After`` asks for the retry. The one answer for this, given by
    the Idempotency-Key middleware (core/idempotency.py) and the agent's heartbeat."""
    response = error_response(error_body("database_unavailable", message), 503)
    response["Retry-After"] = "1"
    return response


def too_large_body(limit: int, setting: str = "API_MAX_REQUEST_BYTES") -> dict[str, Any]:
    return error_body(
        "request_too_large",
        f"A request may be at most {limit} bytes ({setting}).",
        {"body": [f"Larger than {limit} bytes."]},
        {"limit_bytes": limit},
    )


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not is_api_path(request.path):
        return defaults.bad_request(request, exception)  # type: ignore[arg-type]
    if isinstance(exception, RequestDataTooBig):
        return error_response(
            too_large_body(int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0), "DATA_UPLOAD_MAX_MEMORY_SIZE"), 413
        )
    return status_error(400, str(exception) if isinstance(exception, SuspiciousOperation) else None)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not is_api_path(request.path):
        return defaults.permission_denied(request, exception)  # type: ignore[arg-type]
    return status_error(403)


def not_found_body(path: str) -> dict[str, Any]:
    """The 404 of a path that matches nothing and of an object that is not yours: the same words, naming only
    the path the caller sent, so the two read alike."""
    label = field_label(path)
    return error_body(
        "not_found",
        f"Nothing at {label}: no such endpoint, or no such object among yours.",
        {"path": [f"Not found: {label}"]},
    )


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not is_api_path(request.path):
        return defaults.page_not_found(request, exception)  # type: ignore[arg-type]
    return error_response(not_found_body(request.path), 404)


def handler500(request: HttpRequest) -> HttpResponse:
    if not is_api_path(request.path):
        return defaults.server_error(request)
    return status_error(500)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """settings.CSRF_FAILURE_VIEW: the session login and the portal's writes read the reason in the shape."""
    if not is_api_path(request.path):
        return csrf.csrf_failure(request, reason)
    return status_error(403, f"CSRF verification failed: {reason}", {"X-CSRFToken": [reason]})


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, exc.message, exc.fields, exc.extra), status=exc.status_code)
    if isinstance(exc, RequestDataTooBig):
        # Django's own ceiling (DATA_UPLOAD_MAX_MEMORY_SIZE), for a body whose length was not declared.
        limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)
        return Response(
            too_large_body(limit, "DATA_UPLOAD_MAX_MEMORY_SIZE"), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
        )
    if isinstance(exc, SuspiciousOperation):
        # Too many form fields or files, a malformed multipart body: the request's fault, never a 500.
        return Response(error_body("bad_request", str(exc)), status=status.HTTP_400_BAD_REQUEST)
    request = context.get("request")
    if isinstance(exc, Http404) or (
        isinstance(exc, exceptions.NotFound) and exc.detail == exceptions.NotFound.default_detail
    ):
        # A view's bare 404 (get_object, a filter) reads as the 404 of a path that matches nothing.
        if request is not None:
            return Response(not_found_body(request.path), status=status.HTTP_404_NOT_FOUND)
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = flatten_errors(exc.detail)
        response.data = error_body("validation_error", _summary(fields), fields)
    elif isinstance(exc, exceptions.APIException):
        detail = exc.detail
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        if isinstance(detail, (dict, list)):
            fields = flatten_errors(detail)
            response.data = error_body(str(code), _summary(fields), fields)
        else:
            response.data = error_body(str(code), str(detail))
        if response.status_code == status.HTTP_429_TOO_MANY_REQUESTS and getattr(exc, "wait", None):
            response.data["error"]["retry_after_s"] = exc.wait  # type: ignore[attr-defined]
    return response
