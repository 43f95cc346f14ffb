"""Serve the built portal (frontend/dist) at every path the API, admin and probes do not claim.

The portal routes in the browser, so a deep link such as /reservations/<id> must answer with index.html;
hashed files under /assets/ are immutable and cached for a year, index.html never, so a new build is seen
at once. Anything under /api/ is never answered with the page: a missing endpoint must stay a JSON 404.

``npm run build`` writes a ``.br`` and a ``.gz`` beside each compressible file; a client that accepts one
gets it as is (brotli first), with ``Content-Encoding`` and ``Vary: Accept-Encoding``, so nothing is
compressed per request and a shared cache keeps the variants apart.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.urls import re_path
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_safe

# Paths the portal never answers; kept out of the URL pattern itself so that Django's APPEND_SLASH still
# redirects /api/v1/me to /api/v1/me/ instead of the catch-all swallowing it.
_RESERVED = r"(?:api|admin|static|metrics|healthz|livez|readyz)(?:/|$)"
_IMMUTABLE = "public, max-age=31536000, immutable"
# The server's order of preference: brotli is smaller than gzip for the same file.
_VARIANTS = (("br", ".br"), ("gzip", ".gz"))

NOT_BUILT = """<!doctype html><html lang="en"><meta charset="utf-8"><title>Portal not built</title>
<body style="font-family: sans-serif; max-width: 40em; margin: 4em auto">
<h1>The portal is not built</h1>
<p>Build it with <code>cd frontend &amp;&amp; npm ci &amp;&amp; npm run build</code>, or run
<code>python manage.py runsystem</code>, which builds it. The API is at <a href="/api/v1/docs/">/api/v1/docs/</a>
and the admin at <a href="/admin/">/admin/</a>.</p></body></html>"""


def dist_dir() -> Path:
    return Path(getattr(settings, "FRONTEND_DIST", Path(settings.BASE_DIR) / "frontend" / "dist"))


def _file_in_dist(relative: str) -> Path | None:
    root = dist_dir().resolve()
    candidate = (root / relative).resolve()
    # resolve() then is_relative_to: "../" and symlinks cannot reach outside the build.
    if not candidate.is_relative_to(root) or not candidate.is_file():
        return None
    return candidate


def accepted_encodings(header: str) -> set[str]:
    """The content codings an Accept-Encoding header allows (RFC 9110 12.5.3): q=0 refuses, ``*`` is any other."""
    allowed: set[str] = set()
    refused: set[str] = set()
    for item in header.split(","):
        name, _, params = item.partition(";")
        coding = name.strip().lower()
        if not coding:
            continue
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        (allowed if quality > 0 else refused).add(coding)
    if "*" in allowed:
        allowed |= {coding for coding, _ in _VARIANTS} - refused
    return allowed


def _pick_variant(request: HttpRequest, relative: str, found: Path) -> tuple[Path, str | None]:
    """The precompressed file to send for ``relative`` and its coding, or the file itself and None."""
    allowed = accepted_encodings(request.headers.get("Accept-Encoding", ""))
    for coding, suffix in _VARIANTS:
        if coding in allowed:
            # Through _file_in_dist like the original: a variant is only ever a sibling inside the build.
            variant = _file_in_dist(relative + suffix)
            if variant is not None:
                return variant, coding
    return found, None


def _file_response(request: HttpRequest, relative: str, found: Path, cache_control: str) -> FileResponse:
    chosen, coding = _pick_variant(request, relative, found)
    # The type, and the name Django puts in Content-Disposition, are the original's, never "x.js.br"'s.
    response = FileResponse(chosen.open("rb"), content_type=mimetypes.guess_type(found.name)[0], filename=found.name)
    if coding:
        response["Content-Encoding"] = coding
    patch_vary_headers(response, ("Accept-Encoding",))
    response["Cache-Control"] = cache_control
    return response


@require_safe
def spa_asset(request: HttpRequest, path: str) -> FileResponse:
    relative = f"assets/{path}"
    found = _file_in_dist(relative)
    if found is None:
        raise Http404("No such asset.")
    return _file_response(request, relative, found, _IMMUTABLE)


@require_safe
def spa_index(request: HttpRequest, path: str = "") -> HttpResponseBase:
    # Top-level files of the build (favicon.svg, robots.txt) are served as themselves.
    if path and "/" not in path:
        found = _file_in_dist(path)
        if found is not None and found.name != "index.html":
            return _file_response(request, path, found, "public, max-age=3600")
    index = _file_in_dist("index.html")
    if index is None:
        response = HttpResponse(NOT_BUILT, status=503, content_type="text/html; charset=utf-8")
    else:
        chosen, coding = _pick_variant(request, "index.html", index)
        response = HttpResponse(chosen.read_bytes(), content_type="text/html; charset=utf-8")
        if coding:
            response["Content-Encoding"] = coding
        patch_vary_headers(response, ("Accept-Encoding",))
    response["Cache-Control"] = "no-cache"
    return response


urlpatterns = [
    re_path(r"^assets/(?P<path>.+)$", spa_asset, name="spa-asset"),
    re_path(rf"^(?!{_RESERVED})(?P<path>.*)$", spa_index, name="spa"),
]
