"""/static/ is served by the application itself (WhiteNoise, through the finders), so the API docs' Swagger UI
loads from this server, with no CDN and no collectstatic step."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from html.parser import HTMLParser
from wsgiref.util import setup_testing_defaults

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href"}.get(tag)
        for name, value in attrs:
            if name == wanted and value:
                self.urls.append(value)


def referenced_urls(html: str) -> list[str]:
    parser = _Refs()
    parser.feed(html)
    return parser.urls


def body(response) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_the_api_docs_name_only_local_scripts_and_styles_and_each_is_served() -> None:
    client = Client()
    page = client.get("/api/v1/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    urls = referenced_urls(html)
    assert any(u.endswith("swagger-ui-bundle.js") for u in urls), urls
    assert any(u.endswith("swagger-ui.css") for u in urls), urls
    assert not re.search(r"https?://", " ".join(urls)), urls
    # Not only the tags: no script is fetched from elsewhere by the page's inline code either.
    assert not re.search(r"""["'](?:https?:)?//""", html)
    for url in urls:
        assert url.startswith("/static/"), url
        response = client.get(url)
        assert response.status_code == 200, url
        assert body(response), url


def test_a_missing_static_file_is_a_404() -> None:
    assert Client().get("/static/drf_spectacular_sidecar/swagger-ui-dist/no-such.js").status_code == 404


def _wsgi_get(application, path: str) -> tuple[str, bytes]:  # type: ignore[no-untyped-def]
    environ: dict[str, object] = {"PATH_INFO": path, "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []

    def start_response(line: str, headers: Iterable[tuple[str, str]], exc_info: object = None) -> None:
        status.append(line)

    chunks = application(environ, start_response)
    try:
        content = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    return status[0], content


def test_the_wsgi_application_runsystem_and_compose_run_serves_the_docs_assets_and_admin_css() -> None:
    # The entry point gunicorn is given, with DEBUG off as in a deployment: no runserver, no collectstatic.
    from controlplane.core.management.localwsgi import application

    for path in ("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js", "/static/admin/css/base.css"):
        status, content = _wsgi_get(application, path)
        assert status.startswith("200"), (path, status)
        assert content, path
