"""Serve the built portal (frontend/dist) at every path the API, admin and probes do not claim.

The portal routes in the browser, so a deep link such as /reservations/<id> must answer with index.html;
hashed files under /assets/ are immutable and cached for a year, index.html never, so a new build is seen
at once. Anything under /api/ is never answered with the page: a missing endpoint must stay a JSON 404.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.urls import re_path
from django.views.decorators.http import require_safe

# Paths the portal never answers; kept out of the URL pattern itself so that Django's APPEND_SLASH still
# redirects /api/v1/me to /api/v1/me/ instead of the catch-all swallowing it.
_RESERVED = r"(?:api|admin|static|metrics|healthz|livez|readyz)(?:/|$)"
_IMMUTABLE = "public, max-age=31536000, immutable"

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


@require_safe
def spa_asset(request: HttpRequest, path: str) -> FileResponse:
    found = _file_in_dist(f"assets/{path}")
    if found is None:
        raise Http404("No such asset.")
    response = FileResponse(found.open("rb"), content_type=mimetypes.guess_type(found.name)[0])
    response["Cache-Control"] = _IMMUTABLE
    return response


@require_safe
def spa_index(request: HttpRequest, path: str = "") -> HttpResponseBase:
    # Top-level files of the build (favicon.svg, robots.txt) are served as themselves.
    if path and "/" not in path:
        found = _file_in_dist(path)
        if found is not None and found.name != "index.html":
            file_response = FileResponse(found.open("rb"), content_type=mimetypes.guess_type(found.name)[0])
            file_response["Cache-Control"] = "public, max-age=3600"
            return file_response
    index = _file_in_dist("index.html")
    if index is None:
        response = HttpResponse(NOT_BUILT, status=503, content_type="text/html; charset=utf-8")
    else:
        response = HttpResponse(index.read_bytes(), content_type="text/html; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    return response


urlpatterns = [
    re_path(r"^assets/(?P<path>.+)$", spa_asset, name="spa-asset"),
    re_path(rf"^(?!{_RESERVED})(?P<path>.*)$", spa_index, name="spa"),
]
