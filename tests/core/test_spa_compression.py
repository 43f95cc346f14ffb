"""The built portal is sent precompressed: the .br or .gz the build wrote beside a file, when the client takes it."""

from __future__ import annotations

import gzip
from pathlib import Path

import brotli
import pytest
from django.test import Client, override_settings

from controlplane.core.spa import accepted_encodings

INDEX = b"<!doctype html><title>portal</title><div id=root></div>" * 20
SCRIPT = b"console.log('the portal');\n" * 200
PLAIN = b"\x89PNG not compressible"


@pytest.fixture
def dist(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "dist"
    (root / "assets").mkdir(parents=True)
    for relative, content in (("index.html", INDEX), ("assets/index-abc123.js", SCRIPT), ("favicon.svg", b"<svg/>")):
        (root / relative).write_bytes(content)
        (root / f"{relative}.br").write_bytes(brotli.compress(content))
        (root / f"{relative}.gz").write_bytes(gzip.compress(content))
    (root / "assets" / "logo-abc123.png").write_bytes(PLAIN)
    (root / "assets" / "orphan-abc123.js.br").write_bytes(brotli.compress(b"no original"))
    (tmp_path / "secret.txt").write_text("not for the web")
    (tmp_path / "secret.txt.br").write_bytes(brotli.compress(b"not for the web"))
    with override_settings(FRONTEND_DIST=root):
        yield root


def get(path: str, accept: str | None):  # type: ignore[no-untyped-def]
    response = Client().get(path, headers={} if accept is None else {"Accept-Encoding": accept})
    content = b"".join(response.streaming_content) if response.streaming else response.content  # type: ignore[attr-defined]
    return response, content


@pytest.mark.parametrize("accept", ["gzip, deflate, br", "br", "br;q=0.5, gzip;q=1", "*"])
def test_brotli_is_preferred_whenever_the_client_takes_it(dist: Path, accept: str) -> None:
    response, content = get("/assets/index-abc123.js", accept)
    assert response.status_code == 200
    assert response["Content-Encoding"] == "br"
    assert brotli.decompress(content) == SCRIPT
    assert int(response["Content-Length"]) == len(content)
    assert "javascript" in response["Content-Type"]
    assert response["Cache-Control"] == "public, max-age=31536000, immutable"
    assert ".br" not in response.get("Content-Disposition", "")


@pytest.mark.parametrize("accept", ["gzip, deflate", "br;q=0, gzip", "*, br;q=0"])
def test_gzip_is_the_fallback_when_brotli_is_not_taken(dist: Path, accept: str) -> None:
    response, content = get("/assets/index-abc123.js", accept)
    assert response["Content-Encoding"] == "gzip"
    assert gzip.decompress(content) == SCRIPT


@pytest.mark.parametrize("accept", [None, "", "identity", "deflate", "br;q=0, gzip;q=0", "*;q=0", "gzip;q=bad"])
def test_the_file_itself_is_sent_when_no_variant_is_taken(dist: Path, accept: str | None) -> None:
    response, content = get("/assets/index-abc123.js", accept)
    assert response.status_code == 200
    assert "Content-Encoding" not in response
    assert content == SCRIPT


@pytest.mark.parametrize("accept", [None, "br", "gzip"])
def test_every_answer_varies_on_accept_encoding_so_caches_keep_the_variants_apart(
    dist: Path, accept: str | None
) -> None:
    for path in ("/assets/index-abc123.js", "/", "/favicon.svg"):
        response, _ = get(path, accept)
        assert "Accept-Encoding" in response["Vary"], path


@pytest.mark.parametrize("path", ["/", "/reservations/5f0c7a3e-0000-4000-8000-000000000000", "/login?next=/usage"])
def test_the_page_is_sent_compressed_and_never_cached(dist: Path, path: str) -> None:
    response, content = get(path, "gzip, br")
    assert response["Content-Encoding"] == "br"
    assert brotli.decompress(content) == INDEX
    assert response["Content-Type"].startswith("text/html")
    assert response["Cache-Control"] == "no-cache"
    response, content = get(path, None)
    assert content == INDEX and "Content-Encoding" not in response


def test_a_file_the_build_did_not_compress_is_sent_as_is(dist: Path) -> None:
    response, content = get("/assets/logo-abc123.png", "br, gzip")
    assert "Content-Encoding" not in response
    assert content == PLAIN
    assert response["Content-Type"] == "image/png"


def test_top_level_files_are_sent_compressed_with_their_own_type(dist: Path) -> None:
    response, content = get("/favicon.svg", "gzip")
    assert response["Content-Encoding"] == "gzip"
    assert response["Content-Type"] == "image/svg+xml"
    assert gzip.decompress(content) == b"<svg/>"


def test_a_missing_asset_is_404_even_when_a_compressed_copy_exists(dist: Path) -> None:
    for path in ("/assets/nope.js", "/assets/orphan-abc123.js"):
        response, _ = get(path, "br, gzip")
        assert response.status_code == 404, path


def test_compressed_siblings_outside_the_build_cannot_be_reached(dist: Path) -> None:
    for path in ("/assets/../../secret.txt", "/assets/%2e%2e/%2e%2e/secret.txt", "/assets/..%2f..%2fsecret.txt"):
        response, content = get(path, "br")
        assert response.status_code == 404, path
        assert b"not for the web" not in content


@pytest.mark.django_db
def test_a_missing_api_path_stays_a_json_404_and_a_missing_page_is_the_portal(dist: Path) -> None:
    response, content = get("/api/v1/no-such-endpoint/", "br, gzip")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert "Content-Encoding" not in response
    assert response.json()["error"]["code"]
    response, content = get("/no/such/page", "br, gzip")
    assert response.status_code == 200
    assert brotli.decompress(content) == INDEX


def test_accept_encoding_parsing_honours_q_values_and_the_wildcard() -> None:
    assert accepted_encodings("gzip, deflate, br") == {"gzip", "deflate", "br"}
    assert accepted_encodings(" BR ; q=0.1 ,gzip;q=0") == {"br"}
    assert accepted_encodings("*;q=0.5, gzip;q=0") == {"*", "br"}
    assert accepted_encodings("") == set()
    assert accepted_encodings("gzip;q=nonsense") == set()
