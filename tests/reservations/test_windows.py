"""The earliest-window search (windows.earliest_window): by hand on a fleet of edge cases, and on random
fleets against what "earliest" means, the first instant at which the booking's own rule places the spec."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Allocation
from controlplane.reservations.selectors import booking_proposal
from controlplane.reservations.specs import GpuSpec, Window
from controlplane.reservations.windows import earliest_window
from tests.reservations.fleet import gpu_model, hold, project, server

pytestmark = pytest.mark.django_db


def random_fleet(rng: random.Random, now):  # type: ignore[no-untyped-def]
    """A few servers of mixed sizes, some GPUs unhealthy or on a draining server, and non-overlapping
    allocations per GPU (some starting before now, some back to back, some released)."""
    model, other = gpu_model(), gpu_model("A100-40GB", memory_mib=40960)
    proj = project()
    for _ in range(rng.randint(2, 6)):
        srv = server(model if rng.random() < 0.85 else other, gpus=rng.choice([2, 4, 8]))
        if rng.random() < 0.1:
            srv.state = ServerState.DRAINING
            srv.save(update_fields=["state"])
    for gpu in Gpu.objects.all():
        if rng.random() < 0.08:
            Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.UNHEALTHY)
        cursor = now - timedelta(minutes=rng.randint(0, 300))
        for _ in range(rng.randint(0, 7)):
            start = cursor + timedelta(minutes=rng.choice([0, 0, rng.randint(1, 20 * 60)]))
            end = start + timedelta(minutes=rng.randint(30, 14 * 60))
            hold(gpu, start, end, proj=proj, active=rng.random() > 0.1)
            cursor = end
    return model


def first_fit(spec: GpuSpec, *, duration: timedelta, within: timedelta, now):  # type: ignore[no-untyped-def]
    """What "earliest" means, from the booking's own rule: the free GPUs only grow at the end of an active
    allocation, so the first window is at ``now`` or at one of those ends, the first at which a booking made
    then (booking_proposal) would be placed."""
    last = now + within - duration
    ends = Allocation.objects.filter(active=True, ends_at__gt=now, ends_at__lte=last).values_list("ends_at", flat=True)
    for t in sorted({now, *ends}):
        proposal = booking_proposal(spec, Window(t, t + duration))
        if proposal is not None:
            return Window(t, t + duration), proposal
    return None


@pytest.mark.parametrize("seed", range(12))
def test_the_earliest_window_is_the_first_instant_a_booking_would_be_placed(seed: int) -> None:
    """Property, on random fleets: the search's answer is the first instant at which booking_proposal, the
    booking's own reads and rule, places the spec, with the GPUs it would place."""
    rng = random.Random(seed)
    now = timezone.now().replace(microsecond=rng.randint(0, 999_999))
    model = random_fleet(rng, now)
    specs = [GpuSpec(gpu_model_id=model.pk, gpu_count=n) for n in (1, 2, 3, 4, 8, 12)]
    specs += [GpuSpec(min_memory_mib=40000, gpu_count=2), GpuSpec(gpu_model_id=model.pk, whole_servers=1)]
    specs.append(GpuSpec(gpu_model_id=model.pk, whole_servers=2))
    answers = []
    for spec in specs:
        for hours in (1, 5, 24):
            for days in (1, 3):
                args = {"duration": timedelta(hours=hours), "within": timedelta(days=days), "now": now}
                found = earliest_window(spec, **args)
                assert found == first_fit(spec, **args), (spec, hours, days)
                answers.append(found)
    # Not only "now" and "never": some answers lie past now.
    assert any(a is not None and a[0].starts_at > now for a in answers)


def edge_fleet(now):  # type: ignore[no-untyped-def]
    """The cases the search treats apart: a gap exactly as long as the window, holds back to back, a GPU with
    no allocation at all, an unhealthy GPU, a draining server, a released hold, another model with less
    memory, and servers that become free at the same instant."""
    model, small = gpu_model(), gpu_model("A100-40GB", memory_mib=40960)
    h = timedelta(hours=1)
    a = server(model, gpus=4)
    gpus = list(Gpu.objects.filter(server=a).order_by("index"))
    hold(gpus[0], now - h, now + 2 * h)
    hold(gpus[0], now + 7 * h, now + 20 * h)  # a gap of exactly 5 hours from now + 2 h
    hold(gpus[1], now - h, now + 3 * h)
    hold(gpus[1], now + 3 * h, now + 9 * h)  # back to back: free from now + 9 h
    Gpu.objects.filter(pk=gpus[2].pk).update(health=GpuHealth.UNHEALTHY)
    hold(gpus[3], now, now + 40 * h, active=False)  # released: it holds nothing
    hold(gpus[3], now + h, now + 6 * h)
    draining = server(model, gpus=2, state=ServerState.DRAINING)  # idle, but no booking may use it
    assert not Allocation.objects.filter(gpu__server=draining).exists()
    for _ in range(3):  # whole servers busy until the same instant
        for gpu in Gpu.objects.filter(server=server(model, gpus=2)):
            hold(gpu, now - h, now + 9 * h)
    for gpu in Gpu.objects.filter(server=server(small, gpus=2)):
        hold(gpu, now + 4 * h, now + 30 * h)
    return model


# On edge_fleet, by hand: (spec, window hours, horizon days) -> the start, in hours after now, or None.
EDGE_CASES = [
    ("count", 1, 1, 1, 0),  # a's fourth GPU is free until its hold at + 1 h
    ("count", 1, 4, 1, 2),  # a's first GPU between its holds, 2 h to 7 h
    ("count", 1, 5, 1, 2),  # that gap is exactly 5 h long
    ("count", 1, 6, 1, 6),  # too short now: a's fourth GPU after its hold
    ("count", 1, 24, 2, 6),
    ("count", 2, 1, 1, 6),  # a's first and fourth GPUs together, 6 h to 7 h
    ("count", 2, 4, 1, 9),  # the back-to-back holds and the three busy servers end at + 9 h
    ("count", 4, 1, 1, 9),
    ("count", 8, 12, 1, 9),  # a's second and fourth GPUs and the three servers' six: all eight healthy ones free
    ("count", 9, 1, 1, 20),  # the ninth is a's first GPU, free after its second hold
    ("count", 9, 5, 1, None),  # a start by + 19 h cannot wait for it
    ("count", 12, 1, 2, None),  # more than the fleet's healthy GPUs of the model on ready servers
    ("memory", 2, 1, 1, 0),  # the smaller model's server is free until + 4 h
    ("memory", 2, 5, 1, 9),  # too short there: a's second and fourth GPUs, or a busy server, at + 9 h
    ("memory", 3, 4, 1, 20),  # three fit one server (a), so they must: a's first GPU is the third, from + 20 h
    ("whole", 1, 1, 1, 9),  # a is not whole (an unhealthy GPU); the busy servers are, from + 9 h
    ("whole", 3, 1, 1, 9),
    ("whole", 4, 1, 2, None),  # three whole ready servers of the model; the draining one is no candidate
]


@pytest.mark.parametrize("second", [0, 1])
@pytest.mark.parametrize(("kind", "n", "hours", "days", "start"), EDGE_CASES)
def test_earliest_window_on_the_edge_fleet(second: int, kind: str, n: int, hours: int, days: int, start) -> None:  # type: ignore[no-untyped-def]
    # A whole second makes the epoch arithmetic exact; a stray microsecond checks the rounding agrees too.
    now = timezone.now().replace(microsecond=0) + timedelta(microseconds=second * 123_457)
    model = edge_fleet(now)
    spec = {
        "count": GpuSpec(gpu_model_id=model.pk, gpu_count=n),
        "memory": GpuSpec(min_memory_mib=40000, gpu_count=n),
        "whole": GpuSpec(gpu_model_id=model.pk, whole_servers=n),
    }[kind]
    args = {"duration": timedelta(hours=hours), "within": timedelta(days=days), "now": now}
    found = earliest_window(spec, **args)
    if start is None:
        assert found is None
        return
    assert found is not None and found[0] == Window(now + timedelta(hours=start), now + timedelta(hours=start + hours))
    # The GPUs are those a booking of that window would get.
    assert found == first_fit(spec, **args)


def test_a_window_as_long_as_a_gap_starts_at_the_end_of_the_hold_before_it() -> None:
    now = timezone.now().replace(microsecond=0)
    model = gpu_model()
    srv = server(model, gpus=2)
    first, second = Gpu.objects.filter(server=srv).order_by("index")
    h = timedelta(hours=1)
    hold(first, now - h, now + 2 * h)
    hold(first, now + 7 * h, now + 50 * h)
    hold(second, now - h, now + 50 * h)
    spec = GpuSpec(gpu_model_id=model.pk, gpu_count=1)

    found = earliest_window(spec, duration=5 * h, within=timedelta(days=3), now=now)
    assert found is not None and found[0].starts_at == now + 2 * h and found[1] == [first.pk]
    # A microsecond longer no longer fits the gap: the next chance is after the last hold.
    found = earliest_window(spec, duration=5 * h + timedelta(microseconds=1), within=timedelta(days=3), now=now)
    assert found is not None and found[0].starts_at == now + 50 * h


def test_of_servers_free_at_the_same_instant_the_best_fit_is_proposed() -> None:
    now = timezone.now()
    model = gpu_model()
    h = timedelta(hours=1)
    big, small = server(model, gpus=8, hostname="a-big"), server(model, gpus=2, hostname="b-small")
    for gpu in Gpu.objects.filter(server__in=[big, small]):
        hold(gpu, now - h, now + 3 * h)
    spec = GpuSpec(gpu_model_id=model.pk, gpu_count=2)

    found = earliest_window(spec, duration=2 * h, within=timedelta(days=1), now=now)
    assert found is not None and found[0].starts_at == now + 3 * h
    assert set(found[1]) == set(Gpu.objects.filter(server=small).values_list("pk", flat=True))
