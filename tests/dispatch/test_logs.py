"""Live logs: the agent's ingest (offsets, resends, holes, the keep limit, who may write) and the tenant's API
(who may read, the JSON answer, and the Server-Sent Events follow against a live server)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.dispatch import logs
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch, LaunchLog, LaunchLogChunk
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from nodeagent import schema
from tests.dispatch.logs_support import Follower, batch, chunk, running_launch, short_streams
from tests.factories import ApiTokenFactory, UserFactory

AGENT_URL = "/api/v1/agent/logs/"


def agent(credential: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return client


def post(client: APIClient, body: Any) -> Any:
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.generic("POST", AGENT_URL, raw, content_type="application/json")


def send(client: APIClient, *chunks: dict[str, Any]) -> dict[str, int]:
    response = post(client, batch(*chunks))
    assert response.status_code == 200, response.content
    return dict(response.json()["next_offsets"])


def kept(launch: Launch) -> bytes:
    return b"".join(bytes(c.data) for c in LaunchLogChunk.objects.filter(log__launch=launch).order_by("offset"))


def logs_url(launch: Launch) -> str:
    return f"/api/v1/reservations/{launch.reservation.public_id}/logs/"


def finish(launch: Launch) -> None:
    """The container exited, the agent said so, and the reservation completed."""
    now = timezone.now()
    Launch.objects.filter(pk=launch.pk).update(state=LaunchState.EXITED, exit_code=0, finished_at=now)
    Reservation.objects.filter(pk=launch.reservation_id).update(state=ReservationState.COMPLETED)


# -- ingest ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_chunks_are_stored_by_offset_and_the_reply_says_where_to_go_on() -> None:
    launch, credential = running_launch()
    client = agent(credential)
    assert send(client, chunk(launch, 0, b"")) == {launch.launch_id: 0}  # a probe: where are you?
    assert send(client, chunk(launch, 0, b"epoch 1\n")) == {launch.launch_id: 8}
    assert send(client, chunk(launch, 8, b"epoch 2\n"), chunk(launch, 16, b"epoch 3\n")) == {launch.launch_id: 24}
    assert kept(launch) == b"epoch 1\nepoch 2\nepoch 3\n"
    log = LaunchLog.objects.get(launch=launch)
    assert (log.received, log.kept_from, log.kept_bytes, log.eof) == (24, 0, 24, False)
    # Contiguous writes share a row: a line every quarter second must not become a row every quarter second.
    assert LaunchLogChunk.objects.filter(log=log).count() == 1


@pytest.mark.django_db
def test_a_resent_chunk_is_skipped() -> None:
    launch, credential = running_launch()
    client = agent(credential)
    send(client, chunk(launch, 0, b"once\n"))
    assert send(client, chunk(launch, 0, b"once\n"), chunk(launch, 0, b"once\n")) == {launch.launch_id: 5}
    assert kept(launch) == b"once\n"


@pytest.mark.django_db
def test_an_overlapping_chunk_appends_only_its_new_part() -> None:
    launch, credential = running_launch()
    client = agent(credential)
    send(client, chunk(launch, 0, b"abcdef"))
    assert send(client, chunk(launch, 3, b"defghi")) == {launch.launch_id: 9}
    assert kept(launch) == b"abcdefghi"


@pytest.mark.django_db
def test_chunks_out_of_order_in_one_batch_are_applied_in_offset_order() -> None:
    launch, credential = running_launch()
    assert send(agent(credential), chunk(launch, 3, b"def"), chunk(launch, 0, b"abc")) == {launch.launch_id: 6}
    assert kept(launch) == b"abcdef"


@pytest.mark.django_db
def test_a_gap_is_recorded_and_the_api_says_where_bytes_are_missing(make_user: Any) -> None:
    owner = make_user()
    launch, credential = running_launch(owner=owner)
    send(agent(credential), chunk(launch, 0, b"abc"), chunk(launch, 10, b"xyz\n"))
    client = APIClient()
    client.force_authenticate(owner)
    [entry] = client.get(logs_url(launch)).json()["launches"]
    assert entry["text"] == "abcxyz\n"
    assert entry["gaps"] == [{"offset": 3, "bytes": 7}]
    assert (entry["cut"], entry["next_offset"]) == (0, 14)


@pytest.mark.django_db
@override_settings(DISPATCH_LOG_KEEP_BYTES=2048)
def test_output_past_the_keep_limit_drops_the_oldest_and_says_where_it_was_cut(make_user: Any) -> None:
    owner = make_user()
    launch, credential = running_launch(owner=owner)
    client = agent(credential)
    written = b"".join(f"line {i:04d} ".encode() + b"x" * 89 + b"\n" for i in range(50))  # 50 x 100 bytes
    for offset in range(0, len(written), 700):
        send(client, chunk(launch, offset, written[offset : offset + 700]))
    log = LaunchLog.objects.get(launch=launch)
    assert (log.received, log.kept_bytes, log.kept_from) == (5000, 2048, 5000 - 2048)
    assert kept(launch) == written[-2048:]
    api = APIClient()
    api.force_authenticate(owner)
    [entry] = api.get(logs_url(launch)).json()["launches"]
    assert (entry["cut"], entry["text"]) == (5000 - 2048, written[-2048:].decode())


@pytest.mark.django_db
@override_settings(DISPATCH_LOG_KEEP_BYTES=1024)
def test_one_chunk_larger_than_the_keep_limit_keeps_its_newest_bytes() -> None:
    launch, credential = running_launch()
    data = bytes(range(256)) * 16  # 4096 bytes
    send(agent(credential), chunk(launch, 0, data))
    assert kept(launch) == data[-1024:]
    assert LaunchLog.objects.get(launch=launch).kept_from == 4096 - 1024


@pytest.mark.django_db
def test_eof_marks_the_output_complete() -> None:
    launch, credential = running_launch()
    client = agent(credential)
    send(client, chunk(launch, 0, b"done\n"))
    assert not LaunchLog.objects.get(launch=launch).eof
    send(client, chunk(launch, 5, b"", eof=True))
    assert LaunchLog.objects.get(launch=launch).eof


@pytest.mark.django_db
def test_an_agent_cannot_write_the_logs_of_another_servers_launch() -> None:
    theirs, _ = running_launch()
    mine, credential = running_launch()
    reply = send(agent(credential), chunk(theirs, 0, b"forged\n"), chunk(mine, 0, b"mine\n"), chunk("no-such", 0, b"x"))
    assert reply == {mine.launch_id: 5}
    assert not LaunchLog.objects.filter(launch=theirs).exists()
    assert kept(mine) == b"mine\n"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (batch(chunk("L", 0, b"x") | {"data": "not base64!"}), "chunks.0.data"),
        (batch(chunk("L", 0, b"x") | {"offset": -1}), "chunks.0.offset"),
        (batch(chunk("L", 0, b"x") | {"launch_id": ""}), "chunks.0.launch_id"),
        (batch(chunk("L", 0, b"x") | {"extra": 1}), "chunks.0.extra"),
        (batch(chunk("L", 0, b"x"), chunk("L", 1, b"ok") | {"data": "QQ"}), "chunks.1.data"),  # bad padding
        ({"schema_version": 2, "chunks": []}, "schema_version"),
        ({"schema_version": 1, "chunks": [chunk("L", 0, b"")] * (schema.MAX_LOG_CHUNKS + 1)}, "chunks"),
        ("{not json", "body"),
    ],
)
def test_a_bad_batch_is_a_400_naming_the_field_and_writes_nothing(body: Any, field: str) -> None:
    launch, credential = running_launch()
    raw = json.dumps(body).replace('"L"', json.dumps(launch.launch_id)) if isinstance(body, dict) else body
    response = post(agent(credential), raw)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert any(name == field or name.startswith(field) for name in error["fields"]), error
    assert not LaunchLogChunk.objects.exists()


@pytest.mark.django_db
def test_a_chunk_of_more_than_the_chunk_limit_is_refused() -> None:
    launch, credential = running_launch()
    data = b"x" * (schema.MAX_LOG_CHUNK_BYTES + 1)
    raw = json.dumps(batch(chunk(launch, 0, data)))
    response = post(agent(credential), raw)
    assert response.status_code == 400
    assert "chunks.0.data" in response.json()["error"]["fields"]


@pytest.mark.django_db
def test_without_a_node_credential_the_endpoint_is_refused(make_user: Any) -> None:
    launch, _ = running_launch()
    body = batch(chunk(launch, 0, b"x"))
    assert post(APIClient(), body).status_code == 401
    token: Any = ApiTokenFactory(user=make_user())
    user_client = APIClient()
    user_client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.plaintext}")
    assert post(user_client, body).status_code == 401
    assert post(agent("gcn_0123456789ab_forged"), body).status_code == 401
    assert not LaunchLogChunk.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_racing_resends_of_the_same_output_store_it_once() -> None:
    """Two agents' worth of batches (a restarted agent's resend beside the old one's) land at once."""
    from django.db import connection

    launch, credential = running_launch()
    data = b"".join(f"{i}\n".encode() for i in range(2000))
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            barrier.wait()
            client = agent(credential)
            for offset in range(0, len(data), 997):
                send(client, chunk(launch, offset, data[offset : offset + 1500]))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert kept(launch) == data
    assert LaunchLog.objects.get(launch=launch).received == len(data)


# -- the tenant's API ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_owner_and_teammate_read_the_logs_and_an_outsider_gets_404(make_user: Any) -> None:
    owner, teammate, outsider = make_user(), make_user(), make_user()
    launch, credential = running_launch(owner=owner, member=teammate)
    send(agent(credential), chunk(launch, 0, "héllo\n".encode()))
    for user in (owner, teammate):
        client = APIClient()
        client.force_authenticate(user)
        response = client.get(logs_url(launch))
        assert response.status_code == 200
        body = response.json()
        [entry] = body["launches"]
        assert entry == {
            "launch_id": launch.launch_id,
            "server": launch.server.hostname,
            "generation": 1,
            "state": launch.state,
            "text": "héllo\n",
            "cut": 0,
            "gaps": [],
            "next_offset": 7,
            "eof": False,
        }
        assert body["cursor"] == f"{launch.pk}-7" and body["finished"] is False
    client = APIClient()
    client.force_authenticate(outsider)
    for query in ("", "?follow=1"):
        response = client.get(logs_url(launch) + query, HTTP_ACCEPT="text/event-stream")
        assert response.status_code == 404
        assert response["Content-Type"].startswith("application/json")
        assert response.json()["error"]["code"] == "not_found"
    assert APIClient().get(logs_url(launch)).status_code in (401, 403)


@pytest.mark.django_db
def test_invalid_utf8_is_shown_with_replacement_characters(make_user: Any) -> None:
    owner = make_user()
    launch, credential = running_launch(owner=owner)
    send(agent(credential), chunk(launch, 0, b"ok \xff\xfe\n"))
    client = APIClient()
    client.force_authenticate(owner)
    assert client.get(logs_url(launch)).json()["launches"][0]["text"] == "ok \ufffd\ufffd\n"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "headers", "field"),
    [
        ("?follow=maybe", {}, "follow"),
        ("?follow=1&after=12-x", {}, "after"),
        ("?follow=1&after=1-2.3", {}, "after"),
        ("?follow=1", {"HTTP_LAST_EVENT_ID": "garbage"}, "Last-Event-ID"),
    ],
)
def test_a_bad_follow_flag_or_cursor_is_a_400_naming_it(make_user: Any, query: str, headers: Any, field: str) -> None:
    owner = make_user()
    launch, _ = running_launch(owner=owner)
    client = APIClient()
    client.force_authenticate(owner)
    response = client.get(logs_url(launch) + query, **headers)
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_a_split_character_waits_for_its_last_byte() -> None:
    text = "→ok€".encode()
    assert logs.complete_utf8(text) == len(text)
    assert logs.complete_utf8(text[:-1]) == len(text) - 3
    assert logs.complete_utf8(text[:-2]) == len(text) - 3
    assert logs.complete_utf8(b"\xff\xff") == 2  # not UTF-8 at all: passed on, replaced when shown
    assert logs.complete_utf8(b"") == 0


@pytest.mark.django_db
def test_the_schema_documents_both_endpoints(api_client: APIClient) -> None:
    paths = api_client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    follow = paths["/api/v1/reservations/{id}/logs/"]["get"]
    assert {"application/json", "text/event-stream"} <= set(follow["responses"]["200"]["content"])
    assert {p["name"] for p in follow["parameters"]} >= {"follow", "after", "Last-Event-ID"}
    assert "post" in paths["/api/v1/agent/logs/"]


# -- following over Server-Sent Events, against the live server -----------------------------------------------


@pytest.fixture
def followed(
    transactional_db: None, live_server: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    short_streams(settings, monkeypatch)
    owner = UserFactory()
    launch, credential = running_launch(owner=owner)
    token: Any = ApiTokenFactory(user=owner)
    followers: list[Follower] = []

    def follow(query: str = "", headers: dict[str, str] | None = None) -> Follower:
        follower = Follower(f"{live_server.url}{logs_url(launch)}?follow=1{query}", token.plaintext, headers)
        followers.append(follower)
        return follower

    yield {"launch": launch, "agent": agent(credential), "follow": follow}
    for follower in followers:
        follower.close()


@pytest.mark.slow
def test_a_follower_sees_new_output_at_once_and_then_the_end(followed: dict[str, Any]) -> None:
    launch, client = followed["launch"], followed["agent"]
    send(client, chunk(launch, 0, b"before\n"))
    follower = followed["follow"]()
    follower.wait(lambda: follower.texts() == "before\n")
    started = time.monotonic()
    send(client, chunk(launch, 7, b"step 1\n"))
    follower.wait(lambda: follower.texts() == "before\nstep 1\n", timeout=2)
    assert time.monotonic() - started < 1.5  # polled every 0.25 s; the margin is for a loaded CI machine
    event = json.loads(follower.events[-1]["data"])
    assert (event["server"], event["launch_id"], event["offset"], event["cut"]) == (
        launch.server.hostname,
        launch.launch_id,
        7,
        0,
    )
    assert follower.events[-1]["id"] == f"{launch.pk}-14"
    # A character split between two writes comes whole.
    euro = "€".encode()
    send(client, chunk(launch, 14, euro[:1]))
    time.sleep(0.6)
    send(client, chunk(launch, 15, euro[1:] + b"\n", eof=True))
    follower.wait(lambda: follower.texts().endswith("€\n"))
    assert "\ufffd" not in follower.texts()
    finish(launch)
    follower.wait(follower.closed.is_set)
    assert follower.events[-1]["event"] == "end"


@pytest.mark.slow
def test_a_reconnect_with_the_last_event_id_resumes_without_repeating(followed: dict[str, Any]) -> None:
    launch, client = followed["launch"], followed["agent"]
    send(client, chunk(launch, 0, b"one\ntwo\n"))
    first = followed["follow"]()
    first.wait(lambda: first.texts() == "one\ntwo\n")
    last_id = first.events[-1]["id"]
    first.close()
    send(client, chunk(launch, 8, b"three\n"))
    by_header = followed["follow"](headers={"Last-Event-ID": last_id})
    by_query = followed["follow"](f"&after={last_id}")
    for follower in (by_header, by_query):
        follower.wait(lambda f=follower: f.texts() == "three\n")
    time.sleep(0.6)
    assert by_header.texts() == by_query.texts() == "three\n"


@pytest.mark.slow
@override_settings(DISPATCH_LOG_KEEP_BYTES=1024)
def test_a_follower_behind_the_cut_is_told_how_much_it_missed(followed: dict[str, Any]) -> None:
    launch, client = followed["launch"], followed["agent"]
    send(client, chunk(launch, 0, b"a" * 10))
    follower = followed["follow"](f"&after={launch.pk}-4")
    follower.wait(lambda: follower.texts() == "a" * 6)
    follower.close()
    send(client, chunk(launch, 10, b"b" * 2000))
    late = followed["follow"](f"&after={launch.pk}-10")
    late.wait(lambda: late.texts() == "b" * 1024)
    assert json.loads(late.events[0]["data"])["cut"] == 2000 - 1024


@pytest.mark.slow
@override_settings(DISPATCH_LOG_FOLLOW_MAX_S=1.5)
def test_a_stream_ends_after_the_follow_limit_without_an_end_event(followed: dict[str, Any]) -> None:
    follower = followed["follow"]()
    follower.wait(follower.closed.is_set, timeout=6)
    assert not any(e.get("event") == "end" for e in follower.events)
    assert any("reconnect" in c for c in follower.comments)


@pytest.mark.slow
def test_a_quiet_stream_gets_keep_alive_comments(followed: dict[str, Any]) -> None:
    follower = followed["follow"]()
    follower.wait(lambda: sum("keep-alive" in c for c in follower.comments) >= 2, timeout=3)
    assert follower.texts() == ""


@pytest.mark.slow
def test_a_launch_that_never_ran_ends_the_stream_without_output(followed: dict[str, Any]) -> None:
    launch = followed["launch"]
    Launch.objects.filter(pk=launch.pk).update(state=LaunchState.FAILED, error="image missing")
    Reservation.objects.filter(pk=launch.reservation_id).update(state=ReservationState.FAILED)
    follower = followed["follow"]()
    follower.wait(follower.closed.is_set, timeout=5)
    assert [e.get("event") for e in follower.events] == ["end"]


@pytest.mark.slow
def test_a_follower_sees_the_images_pull_at_the_window_before_any_output(followed: dict[str, Any]) -> None:
    from controlplane.dispatch.models import Launch

    launch = followed["launch"]
    follower = followed["follow"]()
    progress = {"layers_done": 1, "layers_total": 4, "bytes_done": 5, "bytes_total": 50, "seconds": 2.0}
    Launch.objects.filter(pk=launch.pk).update(pull=progress)
    follower.wait(lambda: any(e.get("event") == "pull" for e in follower.events))
    [pull] = [json.loads(e["data"]) for e in follower.events if e.get("event") == "pull"]
    assert (pull["launch_id"], pull["server"], pull["pull"]) == (launch.launch_id, launch.server.hostname, progress)
    assert pull["image"] == launch.reservation.image
    # The same progress is not sent twice; the next figures are.
    Launch.objects.filter(pk=launch.pk).update(pull={**progress, "layers_done": 4, "seconds": 6.0})
    follower.wait(lambda: sum(e.get("event") == "pull" for e in follower.events) == 2)
    time.sleep(0.6)
    assert sum(e.get("event") == "pull" for e in follower.events) == 2
