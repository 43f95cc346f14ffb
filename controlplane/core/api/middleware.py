"""What every request under /api/ passes first, and what every answer under /api/ looks like.

Before anything reads the request (the idempotency middleware hashes the body, a view parses it):

- a path and query string longer than ``API_MAX_URL_BYTES`` is a 414 ``uri_too_long``.
- a body sent ``Transfer-Encoding: chunked`` (no Content-Length) is read here when the server has taken the
  chunking off (gunicorn, the production server, says so with ``wsgi.input_terminated``), up to the limit
  below, and handed on as if its length had been declared; on a server that has not (Django's development
  and test servers) it is a 411 ``length_required`` naming Content-Length. Django reads a body only as far as
  CONTENT_LENGTH says, so without this a chunked body would read as empty and every field as "required".
- a body declared larger than ``API_MAX_REQUEST_BYTES`` is a 413 ``request_too_large``, unread. The agent's
  endpoints (/api/v1/agent/) keep their own limits (``FLEET_HEARTBEAT_MAX_BYTES`` for the heartbeat), which
  their views enforce. Past the step above every body has a declared length, so that is the whole story.
- a path or a query parameter holding a NUL character is a 400 naming the parameter: PostgreSQL refuses NUL
  in text, so a slug in the path or a ``?gpu_model=`` filter with one would fail in the database as a 500.

- a POST, PUT or PATCH with a body and no Content-Type is read as JSON when its body is JSON (``curl
  --data`` without ``-H``, a script that forgot the header); otherwise it is a 415 naming the header, rather
  than a form whose every field reads as missing.

After: an error page Django wrote itself (under DEBUG, or from a middleware) is answered in the API's one
error shape instead, with its status; so is a DRF error that another renderer wrote (the browsable API's HTML
page, the schema's YAML). DRF's JSON responses, and every answer that is not an error, are left alone.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from controlplane.core.api.errors import error_body, error_response, is_api_path, status_error, too_large_body
from controlplane.core.api.parsers import field_label, parse_json, text_problem

AGENT_PREFIX = "/api/v1/agent/"
# Headers of an error page that still mean something on its JSON replacement.
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate", "Vary")


def declared_length(request: HttpRequest) -> int:
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


_BODY_METHODS = ("POST", "PUT", "PATCH")
MISSING_CONTENT_TYPE = (
    "The body has no Content-Type header and is not JSON: send Content-Type: application/json with a JSON body."
)


def _untyped_body(request: HttpRequest) -> HttpResponse | None:
    """Read an untyped body as JSON when it is JSON; a 415 naming the header when it is not."""
    if request.method not in _BODY_METHODS or request.META.get("CONTENT_TYPE") or not declared_length(request):
        return None
    try:
        # The parser the view will use, so "is JSON" means the same here and there; a refusal it would give
        # for a JSON body (too deep, a NUL) is still JSON and is left to the view to word.
        parse_json(request.body)
    except ParseError:
        return error_response(
            error_body("unsupported_media_type", MISSING_CONTENT_TYPE, {"Content-Type": ["This header is required."]}),
            415,
        )
    except ValidationError:
        pass  # JSON the parser refuses for its content (too deep, a NUL): the view's parser words it
    request.META["CONTENT_TYPE"] = "application/json"
    return None


LENGTH_REQUIRED = (
    "This server cannot read a body sent with Transfer-Encoding (chunked): send it with a Content-Length header."
)


def _body_limit(request: HttpRequest) -> tuple[int, str]:
    if is_api_path(request.path_info) and not request.path_info.startswith(AGENT_PREFIX):
        return int(settings.API_MAX_REQUEST_BYTES), "API_MAX_REQUEST_BYTES"
    # The agent's views (and Django's forms outside /api/) judge their own bodies within Django's ceiling.
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0), "DATA_UPLOAD_MAX_MEMORY_SIZE"


def _read_at_most(stream: Any, size: int) -> bytes:
    """Up to ``size`` bytes, to the end of the body (a server's read may return less than it was asked)."""
    parts: list[bytes] = []
    left = size
    while left > 0:
        part = stream.read(min(left, 64 * 1024))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _read_chunked(request: HttpRequest) -> HttpResponse | None:
    """A body without a declared length: read it where the server de-chunked it, else a 411, never "empty"."""
    if not request.META.get("HTTP_TRANSFER_ENCODING"):
        return None
    api = is_api_path(request.path_info)
    if not request.META.get("wsgi.input_terminated"):
        # Django's development server hands the body on still chunked, with no length: unreadable as sent.
        if not api:
            return HttpResponse(LENGTH_REQUIRED, status=411, content_type="text/plain; charset=utf-8")
        return error_response(
            error_body("length_required", LENGTH_REQUIRED, {"Content-Length": ["This header is required."]}), 411
        )
    limit, setting = _body_limit(request)
    body = _read_at_most(request.META["wsgi.input"], limit + 1)
    if len(body) > limit:
        if not api:
            return HttpResponse(status=413)
        return error_response(too_large_body(limit, setting), 413)
    # As WSGIRequest would have set it up had the length been declared: what follows (the idempotency key's
    # hash, DRF's parsers, the heartbeat's own limit) reads an ordinary body.
    request.META["CONTENT_LENGTH"] = str(len(body))
    request._stream = LimitedStream(io.BytesIO(body), len(body))  # type: ignore[assignment]
    return None


def _refusal(request: HttpRequest) -> HttpResponse | None:
    url_limit = int(settings.API_MAX_URL_BYTES)
    url_bytes = len(request.META.get("PATH_INFO", "").encode("utf-8", "surrogateescape")) + len(
        request.META.get("QUERY_STRING", "")
    )
    if url_bytes > url_limit:
        return error_response(
            error_body(
                "uri_too_long",
                f"The path and query string may be at most {url_limit} bytes (API_MAX_URL_BYTES).",
                {"path": [f"Longer than {url_limit} bytes."]},
                {"limit_bytes": url_limit},
            ),
            414,
        )
    limit = int(settings.API_MAX_REQUEST_BYTES)
    if declared_length(request) > limit and not request.path_info.startswith(AGENT_PREFIX):
        return error_response(too_large_body(limit), 413)
    problem = text_problem(request.path)
    if problem:
        return error_response(error_body("validation_error", f"path: {problem}", {"path": [problem]}), 400)
    for key, values in request.GET.lists():
        problem = text_problem(key) or next((p for p in map(text_problem, values) if p), None)
        if problem:
            name = field_label(key)
            return error_response(error_body("validation_error", f"{name}: {problem}", {name: [problem]}), 400)
    return _untyped_body(request)


def _in_shape(response: HttpResponse) -> HttpResponse:
    if response.status_code < 400 or response.streaming:
        return response
    if response.get("Content-Type", "").startswith("application/json"):
        return response
    if isinstance(response, Response):
        if not isinstance(response.data, dict):
            return response
        # An error rendered by the endpoint's other renderer: the browsable API's page (a browser reading /api/
        # sees the error itself), the schema's YAML when its ?format= was refused. A CSV report's renderer
        # writes its errors as JSON itself.
        replacement = HttpResponse(
            JSONRenderer().render(response.data), status=response.status_code, content_type="application/json"
        )
        for header in _KEPT_HEADERS:
            if header in response:
                replacement[header] = response[header]
        return replacement
    replacement = status_error(response.status_code)
    for header in _KEPT_HEADERS:
        if header in response:
            replacement[header] = response[header]
    return replacement


class ApiGuardMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = _read_chunked(request)
        if not is_api_path(request.path_info):
            return refused or self.get_response(request)
        return _in_shape(refused or _refusal(request) or self.get_response(request))
