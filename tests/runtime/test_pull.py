"""Pulls for launches against the real engine and the real registry (tests/registry_support.py): a private image
with credentials runs and reports its digest, wrong credentials and a typo fail with the reason in words before the
window, a pull that never ends is abandoned, and a registry mirror (a second registry as a pull-through cache)
serves a pull, with the origin as the fallback."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from nodeagent import schema
from tests import registry_support

from .image_support import push_distinct, remove_image, remove_repository, sized_image, unique
from .support import T0, ours, wait_for

pytestmark = pytest.mark.docker

READER = ("reader", "reader-pw")


def converge(runtime, spec, now, *, until, timeout=120.0, settle=5.0):  # type: ignore[no-untyped-def]
    """Reconcile (each time the runtime's background work finished, or ``settle`` seconds passed) until
    ``until(report)`` holds."""

    def step():  # type: ignore[no-untyped-def]
        runtime.reconcile([spec], [], now)
        runtime.wait_idle(settle)
        reports = {r.launch_id: r for r in runtime.report()}
        report = reports.get(spec.launch_id)
        return report if report is not None and until(report) else None

    return wait_for(step, timeout=timeout, what=f"launch {spec.launch_id}", interval=0.05)


def auth_for(registry, user=READER) -> schema.RegistryAuth:  # type: ignore[no-untyped-def]
    return schema.RegistryAuth(registry=registry.host, username=user[0], password=user[1])


@pytest.fixture
def private_image(docker_client, oci_registry, busybox_image) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    repository = unique("team/pull")
    image, digest = push_distinct(docker_client, oci_registry, busybox_image, repository)
    yield image, digest
    remove_repository(docker_client, f"{oci_registry.host}/{repository}")


def test_a_private_image_with_credentials_is_pulled_runs_and_reports_its_digest(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, docker_client, node, oci_registry, private_image, caplog
):
    caplog.set_level(logging.DEBUG)
    image, digest = private_image
    runtime = make_runtime()
    spec = make_desired(image=image, registry_auth=auth_for(oci_registry), command=["sleep", "60"])

    report = converge(runtime, spec, T0, until=lambda r: r.state == "running")

    assert report.image_digest == digest
    [container] = ours(docker_client, node)
    assert container.attrs["State"]["Status"] == "running"
    [board] = [r for r in runtime.images.board.unsent() if r.image == image]
    assert (board.state, board.digest, board.reservations) == ("present", digest, [spec.reservation])
    assert board.progress is not None and board.progress.layers_total >= 1
    assert board.progress.layers_done == board.progress.layers_total
    assert board.progress.bytes_done == board.progress.bytes_total > 0
    # The password reached the engine and nothing else.
    assert "reader-pw" not in caplog.text
    assert "reader-pw" not in repr(spec) and "reader-pw" not in str(runtime.report())


def test_a_digest_reference_runs_that_digest(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, node, oci_registry, private_image
):
    image, digest = private_image
    by_digest = f"{image.rsplit(':', 1)[0]}@{digest}"
    runtime = make_runtime()
    spec = make_desired(image=by_digest, registry_auth=auth_for(oci_registry), command=["sleep", "60"])

    report = converge(runtime, spec, T0, until=lambda r: r.state == "running")

    assert report.image_digest == digest


def test_wrong_credentials_fail_unauthorized_before_the_window(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, docker_client, node, oci_registry, private_image, caplog
):
    caplog.set_level(logging.DEBUG)
    image, _ = private_image
    runtime = make_runtime()
    wrong = schema.RegistryAuth(registry=oci_registry.host, username="reader", password="not-the-reader-password")
    spec = make_desired(image=image, registry_auth=wrong, window_start=T0 + timedelta(seconds=20))

    report = converge(runtime, spec, T0, until=lambda r: r.state == "failed")

    assert report.error is not None
    assert report.error.startswith(f"unauthorized: the registry refused the credentials for {image}")
    assert ours(docker_client, node) == []
    assert "not-the-reader-password" not in caplog.text and "not-the-reader-password" not in report.error


def test_credentials_for_another_registry_are_not_sent(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, oci_registry, private_image
):
    image, _ = private_image
    runtime = make_runtime()
    elsewhere = schema.RegistryAuth(registry="registry.example.com", username="reader", password="reader-pw")
    spec = make_desired(image=image, registry_auth=elsewhere)

    report = converge(runtime, spec, T0, until=lambda r: r.state == "failed")

    # The registry saw no credentials at all (its own words: "no basic auth credentials").
    assert report.error is not None and report.error.startswith("unauthorized:")
    assert "no basic auth credentials" in report.error


def test_a_typo_in_the_tag_fails_not_found(make_runtime, make_desired, oci_registry, private_image):  # type: ignore[no-untyped-def]
    image, _ = private_image
    runtime = make_runtime()
    typo = image.rsplit(":", 1)[0] + ":v1-typo"
    spec = make_desired(image=typo, registry_auth=auth_for(oci_registry))

    report = converge(runtime, spec, T0, until=lambda r: r.state == "failed")

    assert report.error is not None and report.error.startswith(f"not found: the registry has no image {typo}")


@pytest.fixture
def silent_registry() -> Iterator[str]:
    """A TCP port that accepts connections and never answers: a registry that hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(timeout=2)
    for conn in held:
        conn.close()
    server.close()


def test_a_pull_that_never_ends_shows_progress_then_is_abandoned(make_runtime, make_desired, silent_registry):  # type: ignore[no-untyped-def]
    runtime = make_runtime(pull_stall_s=3)
    spec = make_desired(image=f"{silent_registry}/team/hangs:v1", window_start=T0 + timedelta(seconds=10))

    before = converge(runtime, spec, T0, until=lambda r: r.pull is not None, timeout=10, settle=0.1)
    assert before.state == "pending"  # pulling ahead of its window
    at_window = converge(
        runtime, spec, T0 + timedelta(seconds=10), until=lambda r: r.pull is not None, timeout=10, settle=0.1
    )
    assert at_window.state == "creating" and at_window.pull is not None and at_window.pull.seconds >= 0

    failed = converge(runtime, spec, T0 + timedelta(seconds=11), until=lambda r: r.state == "failed", timeout=30)
    assert failed.error is not None and "no progress pulling" in failed.error
    assert failed.pull is None


def start_mirror(root: Path, upstream: registry_support.Registry) -> registry_support.Registry:
    """A second registry configured as a pull-through cache of ``upstream`` (distribution's ``proxy``).

    The upstream is one without users: distribution's proxy (2.8) sends its ``proxy.username``/``password`` only to
    an upstream that challenges for a bearer token (Docker Hub does), never as basic auth, so it cannot stand in
    front of the htpasswd registry of ``oci_registry``."""
    import subprocess
    import time

    import requests

    port = registry_support.free_port()
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: info\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: gpucp-tests-only\n"
        f"proxy:\n  remoteurl: {upstream.url}\n"
    )
    exe = registry_support.binary()
    assert exe is not None
    log_path = root / "registry.log"
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            [exe, "serve", str(root / "config.yml")], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    mirror = registry_support.Registry(
        host=f"127.0.0.1:{port}", users={}, root=root, process=process, log_path=log_path
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{mirror.url}/v2/", timeout=1).status_code in (200, 401):
                return mirror
        except requests.RequestException:
            time.sleep(0.1)
    mirror.stop()
    raise RuntimeError(f"the mirror did not start: {mirror.log()[-2000:]}")


@pytest.fixture
def public_origin(tmp_path) -> Iterator[registry_support.Registry]:  # type: ignore[no-untyped-def]
    """A registry without users (a public one, as Docker Hub is for public images)."""
    started = registry_support.start_registry(tmp_path / "origin", {})
    yield started
    started.stop()


@pytest.fixture
def mirror(tmp_path, public_origin) -> Iterator[registry_support.Registry]:  # type: ignore[no-untyped-def]
    started = start_mirror(tmp_path / "mirror", public_origin)
    yield started
    started.stop()


def test_the_registry_mirror_serves_the_pull_and_the_image_keeps_its_name(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, docker_client, busybox_image, public_origin, mirror
):
    repository = unique("library/mirrored")
    local = sized_image(docker_client, busybox_image, f"{unique('gpucp-mirror-src')}:v1", 64 * 1024)
    image = f"{public_origin.host}/{repository}:v1"
    try:
        docker_client.images.get(local).tag(f"{public_origin.host}/{repository}", tag="v1")
        for line in docker_client.images.push(f"{public_origin.host}/{repository}", tag="v1", stream=True, decode=True):
            assert "error" not in line, line
    finally:
        remove_image(docker_client, image, local)
    runtime = make_runtime(registry_mirrors={public_origin.host: mirror.host})
    spec = make_desired(image=image, command=["sleep", "60"])
    try:
        report = converge(runtime, spec, T0, until=lambda r: r.state == "running")

        assert report.image_digest is not None and report.image_digest.startswith("sha256:")
        # The mirror holds it now (it fetched it from the origin for this pull), and the engine has it under the
        # reference the launch named as well as the mirror's name.
        assert (mirror.root / "data" / "docker" / "registry" / "v2" / "repositories" / repository).is_dir()
        assert docker_client.images.get(image).id == docker_client.images.get(f"{mirror.host}/{repository}:v1").id
    finally:
        remove_repository(docker_client, f"{mirror.host}/{repository}")
        remove_repository(docker_client, f"{public_origin.host}/{repository}")


def test_a_failing_mirror_falls_back_to_the_registry(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, oci_registry, private_image, mirror
):
    image, digest = private_image
    mirror.stop()  # the mirror is down: the pull goes to the origin, with the tenant's credentials
    runtime = make_runtime(registry_mirrors={oci_registry.host: mirror.host})
    spec = make_desired(image=image, registry_auth=auth_for(oci_registry), command=["sleep", "60"])

    report = converge(runtime, spec, T0, until=lambda r: r.state == "running")

    assert report.image_digest == digest


def test_progress_folds_the_engines_lines_into_layers_and_bytes():
    from nodeagent.runtime.images import Progress

    progress = Progress()
    for line in [
        {"status": "Pulling from team/x", "id": "v1"},
        {"status": "Already exists", "progressDetail": {}, "id": "aaa"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "bbb"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "ccc"},
        {"status": "Downloading", "progressDetail": {"current": 100, "total": 400}, "id": "bbb"},
        {"status": "Downloading", "progressDetail": {"current": 50, "total": 100}, "id": "ccc"},
    ]:
        progress.feed(line)
    middle = progress.snapshot()
    assert (middle.layers_done, middle.layers_total, middle.bytes_done, middle.bytes_total) == (1, 3, 150, 500)
    for line in [
        {"status": "Download complete", "progressDetail": {}, "id": "ccc"},
        {"status": "Pull complete", "progressDetail": {}, "id": "ccc"},
        {"status": "Pull complete", "progressDetail": {}, "id": "bbb"},
        {"status": "Digest: sha256:" + "ab" * 32},
    ]:
        progress.feed(line)
    done = progress.snapshot()
    assert (done.layers_done, done.layers_total, done.bytes_done, done.bytes_total) == (3, 3, 500, 500)
    assert progress.digest == "sha256:" + "ab" * 32


def test_a_failure_reason_never_repeats_the_password():
    from nodeagent.runtime.images import failure_reason

    reason = failure_reason(
        'Get "https://u:s3cret-Pa55@registry.example.com/v2/": unauthorized',
        "registry.example.com/a:b",
        ["s3cret-Pa55"],
    )
    assert reason.startswith("unauthorized: the registry refused the credentials for registry.example.com/a:b")
    assert "s3cret-Pa55" not in reason
