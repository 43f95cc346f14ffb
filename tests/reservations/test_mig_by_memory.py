"""Slices by memory (docs/fractional.md, "Slices by memory"): a minimum memory that MIG slices may meet is
booked on the smallest profile that has the slices free, else on whole GPUs; the availability reads answer
slice specs by the same rule; the queue refuses them by name."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.inventory.models import Gpu, MigDevice
from controlplane.reservations import mig, services
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import GpuSpec, Window
from controlplane.reservations.windows import earliest_booking
from tests.factories import UserFactory
from tests.racing import together
from tests.reservations.fleet import gpu_model, project, spec, window
from tests.reservations.test_api import URL, body
from tests.reservations.test_mig_booking import SEVEN_ONES, book, mig_server

pytestmark = pytest.mark.django_db

GIB = 1024


ONE = GpuSpec(mig_profile="1g.10gb", gpu_count=1)


def by_memory(mib: int, count: int = 1) -> GpuSpec:
    return GpuSpec(min_memory_mib=mib, gpu_count=count, slices=True)


def profiles(r: Reservation) -> list[str | None]:
    return [a.mig_device.profile if a.mig_device else None for a in r.allocations.select_related("mig_device")]


MIXED = [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]


def test_the_smallest_profile_whose_memory_meets_it_is_booked():
    mig_server(gpu_model(), [MIXED])
    proj = project()
    w = window(hours=2)
    for mib, profile in ((10 * GIB, "1g.10gb"), (15 * GIB, "2g.20gb"), (30 * GIB, "3g.40gb")):
        r = book(proj, by_memory(mib), w)
        assert profiles(r) == [profile]
        # The record says what was booked: the profile, its memory dropped.
        r.refresh_from_db()
        assert (r.mig_profile, r.min_memory_mib, r.gpu_count) == (profile, None, 1)


def test_a_full_profile_gives_way_to_the_next_larger_then_to_a_whole_gpu():
    h100 = gpu_model()
    srv = mig_server(h100, [MIXED, []])
    whole = Gpu.objects.get(server=srv, index=1)
    proj = project()
    w = window(hours=2)
    assert profiles(book(proj, by_memory(10 * GIB, count=2), w)) == ["1g.10gb", "1g.10gb"]
    assert profiles(book(proj, by_memory(10 * GIB), w)) == ["2g.20gb"]
    assert profiles(book(proj, by_memory(10 * GIB), w)) == ["3g.40gb"]
    # No slice left: a whole GPU of that memory (not in MIG mode), recorded as a booking by memory.
    r = book(proj, by_memory(10 * GIB), w)
    assert [a.gpu_id for a in r.allocations.all()] == [whole.pk] and profiles(r) == [None]
    r.refresh_from_db()
    assert (r.mig_profile, r.min_memory_mib) == ("", 10 * GIB)
    with pytest.raises(Conflict) as exc:
        book(proj, by_memory(10 * GIB), w)
    assert exc.value.code == "no_capacity"
    # More than any slice holds goes to whole GPUs straight away.
    later = Window(w.ends_at, w.ends_at + timedelta(hours=1))
    assert profiles(book(proj, by_memory(60 * GIB), later)) == [None]


def test_the_count_is_of_one_profile_never_split_across_profiles():
    mig_server(gpu_model(), [[("1g.10gb", 0), ("2g.20gb", 2)]])
    with pytest.raises(Conflict):
        book(project(), by_memory(10 * GIB, count=2), window())  # one of each is free, two of none
    assert not Reservation.objects.exists()


def test_fewer_compute_slices_and_the_plain_profile_come_first():
    mig_server(gpu_model(), [[("1g.10gb+me", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("1g.20gb", 4)]])
    proj = project()
    w = window()
    assert profiles(book(proj, by_memory(10 * GIB), w)) == ["1g.10gb"]
    assert profiles(book(proj, by_memory(10 * GIB), w)) == ["1g.10gb+me"]
    assert profiles(book(proj, by_memory(20 * GIB), w)) == ["1g.20gb"]  # 2 memory slices, 1 compute slice
    assert [s.mig_profile for s in mig.slice_specs(by_memory(20 * GIB))] == ["1g.20gb", "2g.20gb"]


def test_a_booking_by_memory_without_slices_never_takes_them():
    mig_server(gpu_model(), [SEVEN_ONES])
    with pytest.raises(Conflict):
        book(project(), GpuSpec(min_memory_mib=10 * GIB, gpu_count=1), window())


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"min_memory_mib": 1, "gpu_count": 1, "slices": True, "mig_profile": "1g.10gb"}, "spec.slices"),
        ({"gpu_model_id": 1, "gpu_count": 1, "slices": True}, "spec.slices"),
        ({"gpu_count": 1, "slices": True}, "spec.slices"),
        ({"min_memory_mib": 1, "whole_servers": 1, "slices": True}, "spec.whole_servers"),
    ],
)
def test_bad_slices_specs_are_refused_naming_the_field(fields: dict[str, Any], field: str):
    with pytest.raises(ValidationFailed) as exc:
        GpuSpec(**fields).validate()
    assert field in exc.value.fields


# -- the API ---------------------------------------------------------------------------------------------


@pytest.fixture
def member() -> dict[str, Any]:
    user = UserFactory()
    return {"user": user, "project": project(member=user, grant="1000")}


def test_a_booking_by_memory_answers_the_profile_it_got(api_client, member):  # type: ignore[no-untyped-def]
    mig_server(gpu_model(), [SEVEN_ONES])
    api_client.force_authenticate(member["user"])
    asked = {"min_memory_mib": 10 * GIB, "gpu_count": 2, "slices": True}
    response = api_client.post(URL, body(member["project"], spec=asked), format="json")
    assert response.status_code == 201, response.data
    assert response.data["spec"]["mig_profile"] == "1g.10gb" and response.data["spec"]["min_memory_mib"] is None
    assert all(a["mig_device"].startswith("MIG-") for a in response.data["allocations"])


@pytest.mark.parametrize(
    ("asked", "field"),
    [
        ({"min_memory_mib": 10, "gpu_count": 1, "slices": "yes"}, "spec.slices"),
        ({"min_memory_mib": 10, "gpu_count": 1, "slices": 1}, "spec.slices"),
        ({"gpu_model": "H100-80GB", "gpu_count": 1, "slices": True}, "spec.slices"),
        ({"mig_profile": "1g.10gb", "gpu_count": 1, "slices": True}, "spec.slices"),
        ({"min_memory_mib": 10, "whole_servers": 1, "slices": True}, "spec.whole_servers"),
        ({"min_memory_mib": 10, "slices": True}, "spec.gpu_count"),
    ],
)
def test_bad_slices_in_a_booking_are_400s_naming_the_field(api_client, member, asked, field):  # type: ignore[no-untyped-def]
    mig_server(gpu_model(), [SEVEN_ONES])
    api_client.force_authenticate(member["user"])
    response = api_client.post(URL, body(member["project"], spec=asked), format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["error"]["fields"], response.data


@pytest.mark.parametrize(
    "asked",
    [
        {"min_memory_mib": 10, "gpu_count": 1, "slices": True},
        {"mig_profile": "1g.10gb", "gpu_count": 1},
    ],
)
def test_the_queue_refuses_slices_by_name(api_client, member, asked):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(member["user"])
    data = body(member["project"], spec=asked)
    data.pop("window")
    data.update(duration="1h")
    response = api_client.post("/api/v1/requests/", data, format="json")
    assert response.status_code == 400, response.data
    named = next(k for k in asked if k in ("slices", "mig_profile"))
    assert f"spec.{named}" in response.data["error"]["fields"], response.data


# -- availability ------------------------------------------------------------------------------------------


def _free(api_client, **query):  # type: ignore[no-untyped-def]
    now = timezone.now()
    params = {"start": "now", "end": (now + timedelta(hours=1)).isoformat(), **query}
    response = api_client.get("/api/v1/availability/free/", params)
    assert response.status_code == 200, response.data
    return response.data


def test_free_answers_a_profile_with_its_free_slices_and_what_booking_would_take(api_client, member):  # type: ignore[no-untyped-def]
    h100 = gpu_model()
    srv = mig_server(h100, [SEVEN_ONES, []])
    api_client.force_authenticate(member["user"])
    book(member["project"], ONE, window(timedelta(0), hours=3))
    data = _free(api_client, mig_profile="1g.10gb", gpu_count=2)
    assert data["mig_profile"] == "1g.10gb" and data["free_gpus"] == 6
    assert [s["hostname"] for s in data["servers"]] == [srv.hostname] and len(data["servers"][0]["free"]) == 6
    taken = set(MigDevice.objects.filter(allocations__active=True).values_list("uuid", flat=True))
    assert len(data["proposal"]) == 2 and not taken & set(data["proposal"])
    assert _free(api_client, mig_profile="1g.10gb", gpu_count=7)["proposal"] is None
    # By memory: the smallest profile that fits; past every slice, whole GPUs (the one not in MIG mode).
    assert _free(api_client, min_memory_mib=10 * GIB, gpu_count=2, slices="true")["mig_profile"] == "1g.10gb"
    whole = _free(api_client, min_memory_mib=40 * GIB, gpu_count=1, slices="true")
    assert whole["mig_profile"] is None and whole["free_gpus"] == 1
    assert whole["proposal"] == [Gpu.objects.get(server=srv, index=1).uuid]
    none = _free(api_client, min_memory_mib=10 * GIB, gpu_count=7, slices="true")
    assert none["mig_profile"] is None and none["proposal"] is None


def test_free_with_a_bad_slices_value_is_a_400_naming_it(api_client, member):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(member["user"])
    response = api_client.get(
        "/api/v1/availability/free/",
        {"start": "now", "end": "2099-01-01T00:00:00Z", "min_memory_mib": 1, "gpu_count": 1, "slices": "maybe"},
    )
    assert response.status_code == 400 and "slices" in response.data["error"]["fields"], response.data


def test_earliest_waits_for_slices_to_end_and_books_what_it_says(api_client, member):  # type: ignore[no-untyped-def]
    mig_server(gpu_model(), [[("1g.10gb", 0), ("1g.10gb", 1), ("3g.40gb", 4)]])
    proj = member["project"]
    now = timezone.now()
    first = book(proj, ONE, Window(now + timedelta(minutes=1), now + timedelta(hours=2)))
    book(proj, ONE, Window(now + timedelta(minutes=1), now + timedelta(hours=5)))
    api_client.force_authenticate(member["user"])
    response = api_client.get(
        "/api/v1/availability/earliest/", {"mig_profile": "1g.10gb", "gpu_count": 1, "duration_hours": 1}
    )
    assert response.status_code == 200, response.data
    assert response.data["found"] and response.data["mig_profile"] == "1g.10gb"
    assert response.data["start"] == first.ends_at
    held = first.allocations.get().mig_device
    assert response.data["gpus"] == [held.uuid]
    # Booking the window it names gets those devices.
    w = Window(response.data["start"], response.data["end"])
    assert [a.mig_device.uuid for a in book(proj, ONE, w).allocations.all()] == [held.uuid]
    # By memory, the 3g.40gb is free now: the earlier window wins over the smaller profile's.
    found = earliest_booking(by_memory(10 * GIB), duration=timedelta(hours=1), within=timedelta(days=1), now=now)
    assert found is not None and found[0].starts_at == now and found[2] == "3g.40gb"
    assert earliest_booking(by_memory(50 * GIB), duration=timedelta(hours=1), within=timedelta(days=1), now=now) is None


def test_earliest_by_memory_falls_back_to_whole_gpus():
    h100 = gpu_model()
    srv = mig_server(h100, [[("1g.10gb", 0)], []])
    proj = project()
    now = timezone.now()
    book(proj, ONE, Window(now + timedelta(minutes=1), now + timedelta(hours=4)))
    book(proj, spec(h100), Window(now + timedelta(minutes=1), now + timedelta(hours=2)))
    found = earliest_booking(by_memory(10 * GIB), duration=timedelta(hours=1), within=timedelta(days=1), now=now)
    assert found is not None and found[2] is None
    assert found[1] == [Gpu.objects.get(server=srv, index=1).pk]
    assert found[0].starts_at == now + timedelta(hours=2)  # the whole GPU's booking ends before the slice's


# -- racing for the last slice (PostgreSQL) ------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_bookings_by_memory_racing_for_the_last_slice_never_share_it():
    h100 = gpu_model()
    srv = mig_server(h100, [[("1g.10gb", 0)], []])
    whole = Gpu.objects.get(server=srv, index=1)
    proj = project()
    w = window(hours=2)
    for _round in range(5):
        results = together(*[lambda: book(proj, by_memory(10 * GIB), w)] * 2)
        assert all(isinstance(r, Reservation) for r in results), results
        # One took the slice, the other fell back to the whole GPU.
        got = {tuple(profiles(r)) for r in results}
        assert got == {(None,), ("1g.10gb",)}, got
        assert {a.gpu_id for r in results for a in r.allocations.all() if a.mig_device_id is None} == {whole.pk}
        for r in results:
            services.reservation_cancel(reservation=r, actor=None, reason="next round")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_without_a_whole_gpu_the_loser_of_the_last_slice_is_refused():
    mig_server(gpu_model(), [[("1g.10gb", 0)]])
    proj = project()
    w = window(hours=2)
    for _round in range(5):
        results = together(*[lambda: book(proj, by_memory(10 * GIB), w)] * 2)
        won = [r for r in results if isinstance(r, Reservation)]
        assert len(won) == 1, results
        lost = next(r for r in results if not isinstance(r, Reservation))
        assert isinstance(lost, Conflict) and lost.code in ("no_capacity", "gpu_taken"), results
        services.reservation_cancel(reservation=won[0], actor=None, reason="next round")
