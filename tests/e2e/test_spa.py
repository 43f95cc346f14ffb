"""The portal is served by Django at every path the API, admin and probes do not claim."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client, override_settings

INDEX = b"<!doctype html><div id=root></div>"


@pytest.fixture
def dist(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "assets").mkdir()
    (tmp_path / "index.html").write_bytes(INDEX)
    (tmp_path / "assets" / "index-abc123.js").write_text("console.log(1)")
    (tmp_path / "favicon.svg").write_text("<svg/>")
    (tmp_path.parent / "secret.txt").write_text("not for the web")
    with override_settings(FRONTEND_DIST=tmp_path):
        yield tmp_path


PORTAL_PATHS = ["/", "/reservations/5f0c7a3e-0000-4000-8000-000000000000", "/fleet", "/login?next=/usage"]


@pytest.mark.parametrize("path", PORTAL_PATHS)
def test_portal_routes_answer_with_index_html_uncached(dist: Path, path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 200
    assert response.content == INDEX
    assert response["Content-Type"].startswith("text/html")
    assert response["Cache-Control"] == "no-cache"


def test_hashed_assets_are_served_with_long_cache(dist: Path) -> None:
    response = Client().get("/assets/index-abc123.js")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"console.log(1)"  # type: ignore[attr-defined]
    assert "javascript" in response["Content-Type"]
    assert "immutable" in response["Cache-Control"]


def test_top_level_build_files_are_served_as_themselves(dist: Path) -> None:
    response = Client().get("/favicon.svg")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/svg+xml"


def test_a_missing_asset_is_404_not_the_page(dist: Path) -> None:
    assert Client().get("/assets/nope.js").status_code == 404


def test_paths_cannot_escape_the_build_directory(dist: Path) -> None:
    for path in ("/assets/../../secret.txt", "/assets/%2e%2e/%2e%2e/secret.txt", "/assets/..%2f..%2fsecret.txt"):
        assert Client().get(path).status_code == 404, path


@pytest.mark.django_db
def test_unknown_api_paths_stay_json_404s(dist: Path) -> None:
    response = Client().get("/api/v1/no-such-endpoint/")
    assert response.status_code == 404
    assert INDEX not in response.content


@pytest.mark.django_db
def test_api_paths_without_a_slash_still_redirect(dist: Path) -> None:
    response = Client().get("/api/v1/me")
    assert response.status_code == 301
    assert response["Location"] == "/api/v1/me/"


@pytest.mark.django_db
def test_admin_and_probes_are_not_swallowed(dist: Path) -> None:
    assert Client().get("/admin/login/").status_code == 200
    for probe in ("/healthz", "/livez", "/readyz"):
        assert INDEX not in Client().get(probe).content


def test_writes_to_portal_paths_are_refused(dist: Path) -> None:
    assert Client().post("/reservations").status_code == 405


def test_without_a_build_the_page_says_how_to_build_it(tmp_path: Path) -> None:
    with override_settings(FRONTEND_DIST=tmp_path / "missing"):
        response = Client().get("/")
    assert response.status_code == 503
    assert b"npm run build" in response.content
