"""One error shape across the API.

    {"error": {"code": "validation_error", "message": "spec.gpu_count: Ensure this value is ...",
               "fields": {"spec.gpu_count": ["Ensure this value is greater than or equal to 1."]}}}

``message`` is a sentence a person understands; ``fields`` maps dotted field paths to their messages.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, exc.message, exc.fields, exc.extra), status=exc.status_code)
    if isinstance(exc, Http404):
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
