"""``gpucp gpus``, ``book``, ``ls``, ``show``, ``extend`` and ``cancel`` against a live server."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from gpucp_support import Gpucp, World, token_of, user

from controlplane.accounts.choices import Role
from controlplane.accounts.models import Membership
from controlplane.dispatch import reports
from controlplane.dispatch import services as dispatch
from controlplane.dispatch.models import Launch
from controlplane.reservations.models import Reservation
from nodeagent import schema
from tests.reservations.fleet import project

IMAGE = "gpucp-busybox:test"


def book(gpucp: Gpucp, *extra: str, gpus: int = 2, hours: str = "1") -> dict:  # type: ignore[type-arg]
    result = gpucp(
        "--json", "book", "--gpus", str(gpus), "--model", "H100-80GB", "--hours", hours, "--image", IMAGE, *extra
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def later(hours: float = 1) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).replace(microsecond=0).isoformat()


# -- gpus -------------------------------------------------------------------------------------------------


def test_gpus_shows_what_is_free_now_per_model(gpucp: Gpucp):
    result = gpucp("gpus")
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()[1:3]
    assert header.split() == ["MODEL", "MEMORY", "PER", "GPU-HOUR", "FREE", "NOW", "SERVERS", "EARLIEST"]
    # 8 GPUs free on 1 server, and a booking of one GPU for an hour could start now.
    assert row.split() == ["H100-80GB", "80", "GiB", "2.0000", "USD", "8", "1", "now"]


def test_gpus_says_when_the_gpus_free_up_after_a_booking(gpucp: Gpucp):
    taken = book(gpucp, gpus=8, hours="2")
    data = json.loads(gpucp("--json", "gpus", "--model", "H100-80GB", "--gpus", "1").stdout)
    [answer] = data
    assert answer["gpu_model"]["name"] == "H100-80GB"
    assert answer["free"]["free_gpus"] == 0
    assert answer["earliest"]["found"] is True
    assert datetime.fromisoformat(answer["earliest"]["start"]) >= datetime.fromisoformat(taken["ends_at"])
    table = gpucp("--utc", "gpus", "--model", "H100-80GB").stdout
    assert "UTC" in table.splitlines()[-1] and " 0 " in table.splitlines()[-1]


def test_gpus_for_a_model_the_catalog_lacks_gives_the_apis_message(gpucp: Gpucp):
    result = gpucp("gpus", "--model", "NOPE-1GB")
    assert result.exit_code == 1
    assert "gpu_model" in result.stderr and "(validation_error)" in result.stderr


# -- book -------------------------------------------------------------------------------------------------


def test_book_books_the_gpus_with_the_command_and_env(gpucp: Gpucp, world: World):
    result = gpucp(
        "book", "--gpus", "2", "--model", "H100-80GB", "--hours", "4", "--image", IMAGE, "--name", "train",
        "--env", "EPOCHS=3", "-e", "EMPTY=", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    r = Reservation.objects.get()
    assert (r.project, r.name, r.gpu_count, r.image) == (world.project, "train", 2, IMAGE)
    assert r.command == ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"]
    assert r.env == {"EPOCHS": "3", "EMPTY": ""}
    assert r.ends_at - r.starts_at == pytest.approx(timedelta(hours=4), abs=timedelta(seconds=30))
    assert str(r.public_id) in result.stdout and "gpu-h100-01 [" in result.stdout
    assert r.allocations.count() == 2


def test_book_json_is_the_apis_reservation(gpucp: Gpucp):
    detail = book(gpucp, "--name", "x")
    assert detail["name"] == "x" and detail["project"] == "demo" and detail["state"] == "scheduled"
    assert len(detail["allocations"]) == 2 and detail["spec"]["gpu_model"] == "H100-80GB"


def test_book_at_a_given_start(gpucp: Gpucp):
    start = later(3)
    detail = book(gpucp, "--start", start, hours="0.5")
    assert datetime.fromisoformat(detail["starts_at"]) == datetime.fromisoformat(start)
    assert datetime.fromisoformat(detail["ends_at"]) == datetime.fromisoformat(start) + timedelta(minutes=30)


def test_a_repeated_book_with_the_same_idempotency_key_books_once(gpucp: Gpucp):
    args = ("--start", later(2), "--idempotency-key", "nightly-2026-05-01")
    first, second = book(gpucp, *args), book(gpucp, *args)
    assert first["id"] == second["id"]
    assert Reservation.objects.count() == 1
    # The same key for another booking is the API's 422, not a second booking.
    other = gpucp("book", "--model", "H100-80GB", "--hours", "2", "--image", IMAGE, *args)
    assert other.exit_code == 1 and "(idempotency_key_reused)" in other.stderr
    assert Reservation.objects.count() == 1


def test_a_repeated_book_starting_now_with_the_same_key_books_once(gpucp: Gpucp):
    """`--start now` sends a duration, not an end that moves with the clock, so the second run is the same request."""
    args = ("--start", "now", "--idempotency-key", "retry-after-a-crash")
    first = book(gpucp, *args)
    time.sleep(1.1)  # a computed end would now differ by a second
    second = book(gpucp, *args)
    assert first["id"] == second["id"]
    assert Reservation.objects.count() == 1


def test_book_over_quota_exits_1_with_the_apis_message(gpucp: Gpucp, world: World):
    poor = project(owner=world.owner, grant="1", slug="poor")
    result = gpucp(
        "book", "--project", poor.slug, "--model", "H100-80GB", "--gpus", "2", "--hours", "4", "--image", IMAGE
    )
    assert result.exit_code == 1
    assert "(quota_exceeded)" in result.stderr and "credits" in result.stderr
    body = json.loads(
        gpucp("--json", "book", "-p", "poor", "-m", "H100-80GB", "--gpus", "2", "--hours", "4", "--image", IMAGE).stderr
    )
    assert body["error"]["code"] == "quota_exceeded"
    assert result.stderr == f"gpucp: {body['error']['message']} (quota_exceeded)\n"
    assert not Reservation.objects.exists()


def test_book_with_no_capacity_exits_1_with_the_apis_message(gpucp: Gpucp):
    result = gpucp("book", "--model", "H100-80GB", "--gpus", "16", "--hours", "1", "--image", IMAGE)
    assert result.exit_code == 1
    assert "(no_capacity)" in result.stderr
    assert not Reservation.objects.exists()


def test_book_by_a_viewer_exits_3(gpucp: Gpucp, world: World):
    viewer = user()
    Membership.objects.create(project=world.project, user=viewer, role=Role.VIEWER)
    _, token = token_of(viewer)
    result = gpucp("book", "--model", "H100-80GB", "--hours", "1", "--image", IMAGE, token=token)
    assert result.exit_code == 3
    assert "(permission_denied)" in result.stderr


def test_book_in_several_projects_needs_project(gpucp: Gpucp, world: World):
    project(owner=world.owner, slug="second")
    result = gpucp("book", "--model", "H100-80GB", "--hours", "1", "--image", IMAGE)
    assert result.exit_code == 2
    assert "You are in 2 projects (demo, second): give --project." in result.stderr
    assert book(gpucp, "--project", "second")["project"] == "second"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "NOEQUALS"], "is not KEY=VALUE"),
        (["--start", "tomorrow-ish"], 'neither "now" nor an ISO 8601 time'),
        (["--hours", "0"], "--hours"),
        (["--gpus", "0"], "--gpus"),
    ],
)
def test_book_usage_errors_exit_2_before_asking_the_api(gpucp: Gpucp, args: list[str], message: str):
    base = {"--model": "H100-80GB", "--hours": "1", "--image": IMAGE}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    result = gpucp("book", *[x for kv in base.items() for x in kv])
    assert result.exit_code == 2
    assert message in result.stderr
    assert not Reservation.objects.exists()


def test_a_booking_the_api_finds_invalid_exits_1_naming_the_field(gpucp: Gpucp):
    result = gpucp("book", "--model", "H100-80GB", "--hours", "1", "--image", IMAGE, "--env", "1BAD=x")
    assert result.exit_code == 1
    assert "container.env" in result.stderr and "(validation_error)" in result.stderr


# -- ls ---------------------------------------------------------------------------------------------------


def test_ls_shows_the_reservations_holding_gpus_and_all_with_all(gpucp: Gpucp):
    kept = book(gpucp, "--name", "kept", "--start", later(1))
    gone = book(gpucp, "--name", "gone", "--start", later(5))
    assert gpucp("cancel", gone["id"]).exit_code == 0
    result = gpucp("ls")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "PROJECT", "STATE", "GPUS", "START", "END"]
    assert [line.split()[0] for line in lines[1:]] == [kept["id"]]
    assert "2 x H100-80GB" in lines[1] and "scheduled" in lines[1]
    every = gpucp("ls", "--all").stdout
    assert kept["id"] in every and gone["id"] in every and "cancelled" in every
    only = json.loads(gpucp("--json", "ls", "--state", "cancelled").stdout)
    assert [r["id"] for r in only["results"]] == [gone["id"]] and only["count"] == 1


def test_ls_filters_by_project_and_limits(gpucp: Gpucp, world: World):
    project(owner=world.owner, slug="second")
    for _ in range(3):
        book(gpucp, "-p", "demo", gpus=1)
    book(gpucp, "-p", "second", gpus=1)
    page = json.loads(gpucp("--json", "ls", "--project", "second").stdout)
    assert [r["project"] for r in page["results"]] == ["second"]
    limited = gpucp("ls", "--limit", "2")
    assert len(limited.stdout.splitlines()) == 3
    assert "(2 of 4; --limit shows more)" in limited.stderr


def test_ls_with_nothing_says_so(gpucp: Gpucp):
    result = gpucp("ls")
    assert result.exit_code == 0
    assert "No reservations holding GPUs" in result.stdout


def test_ls_with_an_unknown_state_gives_the_apis_message(gpucp: Gpucp):
    result = gpucp("ls", "--state", "sleeping")
    assert result.exit_code == 1
    assert "state" in result.stderr and "(validation_error)" in result.stderr


# -- show -------------------------------------------------------------------------------------------------


def test_show_gives_state_window_gpus_and_events(gpucp: Gpucp):
    detail = book(gpucp, "--name", "look", "--", "sleep", "60")
    result = gpucp("--utc", "show", detail["id"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.splitlines()[0] == f"{detail['id']}  look  (demo)"
    assert "command  sleep 60" in out and "UTC ->" in out
    gpus = [a["gpu"] for a in detail["allocations"]]
    assert all(g in out for g in gpus)
    events = out.split("Events:")[1]
    assert "pending" in events and "scheduled" in events


def test_show_has_the_containers_exit_code_and_log_tail(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--", "sh", "-c", "exit 3")
    reservation = Reservation.objects.get(public_id=detail["id"])
    dispatch.dispatch_open_due(now=timezone.now())
    launch = Launch.objects.get(reservation=reservation)
    now = timezone.now()
    # What the agent's heartbeat reports once the container has exited, through the dispatch service.
    reports.containers_reported(
        server=world.server,
        now=now,
        reports=[
            schema.ContainerReport(
                launch_id=launch.launch_id, reservation=detail["id"], gpu_uuids=list(launch.gpu_uuids),
                state="exited", container_id="c1", started_at=now - timedelta(seconds=5), finished_at=now,
                exit_code=3, log_tail="loading\nTraceback: boom\n",
            )
        ],
    )  # fmt: skip
    out = gpucp("show", detail["id"]).stdout
    containers = out.split("Containers:")[1]
    assert "gpu-h100-01" in containers and " 3 " in containers
    assert "Log of the last container (its last 2 lines):\n  loading\n  Traceback: boom" in out
    data = json.loads(gpucp("--json", "show", detail["id"]).stdout)
    assert data["reservation"]["state"] == "failed"
    assert [(x["exit_code"], x["log_tail"]) for x in data["launches"]] == [(3, "loading\nTraceback: boom\n")]


def test_show_of_a_missing_reservation_exits_4(gpucp: Gpucp):
    result = gpucp("show", str(uuid.uuid4()))
    assert result.exit_code == 4
    assert "(not_found)" in result.stderr


def test_show_of_another_projects_reservation_exits_4(gpucp: Gpucp, world: World):
    detail = book(gpucp)
    _, outsider = token_of(user())
    assert gpucp("show", detail["id"], token=outsider).exit_code == 4


def test_show_of_something_that_is_not_an_id_is_a_usage_error(gpucp: Gpucp):
    result = gpucp("show", "../tokens")
    assert result.exit_code == 2
    assert "is not a valid UUID" in result.stderr


# -- extend and cancel ------------------------------------------------------------------------------------


def test_extend_makes_the_window_longer_on_the_same_gpus(gpucp: Gpucp):
    detail = book(gpucp, "--start", later(1), hours="1")
    result = gpucp("--json", "extend", detail["id"], "--hours", "2", "--reason", "one more epoch")
    assert result.exit_code == 0, result.output
    extended = json.loads(result.stdout)
    assert datetime.fromisoformat(extended["ends_at"]) == datetime.fromisoformat(detail["ends_at"]) + timedelta(hours=2)
    assert [a["gpu"] for a in extended["allocations"]] == [a["gpu"] for a in detail["allocations"]]
    assert extended["events"][-1]["reason"] == "one more epoch"
    human = gpucp("--utc", "extend", detail["id"], "--hours", "0.5")
    assert human.exit_code == 0 and human.stdout.startswith("Extended to ")


def test_extend_into_someone_elses_booking_exits_1_with_the_apis_message(gpucp: Gpucp, world: World):
    first = book(gpucp, "--start", later(1), gpus=8, hours="1")
    book(gpucp, "--start", first["ends_at"], gpus=8, hours="1")
    result = gpucp("extend", first["id"], "--hours", "1")
    assert result.exit_code == 1
    assert result.stderr.startswith("gpucp: ") and "(" in result.stderr


def test_cancel_before_the_window_releases_it(gpucp: Gpucp):
    detail = book(gpucp, "--start", later(2))
    result = gpucp("cancel", detail["id"], "--reason", "plans changed")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"Cancelled {detail['id']}: its GPUs and held credits are released.\n"
    reservation = Reservation.objects.get(public_id=detail["id"])
    assert reservation.state == "cancelled" and not reservation.allocations.filter(active=True).exists()
    again = gpucp("cancel", detail["id"])
    assert again.exit_code == 1
    assert "A cancelled reservation cannot be cancelled: it is in state cancelled" in again.stderr


def test_cancel_during_the_window_ends_it_now(gpucp: Gpucp):
    detail = book(gpucp)
    result = gpucp("--json", "cancel", detail["id"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == "ending"


def test_cancel_of_a_missing_reservation_exits_4(gpucp: Gpucp):
    assert gpucp("cancel", str(uuid.uuid4())).exit_code == 4
