"""The capacity summary (migration 0004) counts what the GPU table holds after any write, and the booking's
candidate read that uses it shortlists the same servers as the read over every GPU."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count, F, Q
from django.utils import timezone

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, Server
from controlplane.reservations.models import Allocation
from controlplane.reservations.selectors import (
    SHORTLIST,
    _build,
    _fitting_from_summary,
    _server_counts,
    _shortlist,
    candidate_servers,
    usable_whole_q,
)
from controlplane.reservations.specs import GpuSpec, Window
from tests.reservations.fleet import gpu_model, hold, project, server

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def summary() -> dict[tuple[int, int], tuple[str, bool, int, int]]:
    """Per server and model: hostname, ready, present and healthy GPUs, and GPU rows of any state."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT server_id, model_id, hostname, ready, healthy, gpus FROM reservations_server_capacity")
        return {(s, m): (h, r, n, g) for s, m, h, r, n, g in cursor.fetchall() if g}


def counted() -> dict[tuple[int, int], tuple[str, bool, int, int]]:
    rows = (
        Gpu.objects.values("server_id", "model_id", "server__hostname", "server__state")
        .annotate(n=Count("id", filter=usable_whole_q() & Q(present=True, health=GpuHealth.HEALTHY)), g=Count("id"))
        .order_by()
    )
    return {
        (r["server_id"], r["model_id"]): (
            r["server__hostname"],
            r["server__state"] == ServerState.READY,
            r["n"],
            r["g"],
        )
        for r in rows
    }


def test_the_summary_follows_every_kind_of_write_to_gpus_and_servers() -> None:
    rng = random.Random(4)
    model, other = gpu_model(), gpu_model("A100-40GB", memory_mib=40960)
    servers = [server(model if i % 3 else other, gpus=rng.choice([1, 4, 8])) for i in range(8)]
    assert summary() == counted()
    for step in range(60):
        gpu = Gpu.objects.order_by("?").first()
        assert gpu is not None
        kind = step % 7
        if kind == 0:  # a health report, through the ORM's save()
            gpu.health = GpuHealth.UNHEALTHY if gpu.health == GpuHealth.HEALTHY else GpuHealth.HEALTHY
            gpu.save(update_fields=["health"])
        elif kind == 1:  # a GPU that went missing, or came back, by a bulk update
            Gpu.objects.filter(pk=gpu.pk).update(present=not gpu.present)
        elif kind == 2:  # a card of another model in its place
            Gpu.objects.filter(pk=gpu.pk).update(model=other if gpu.model_id == model.pk else model)
        elif kind == 3:  # a drain, or a return to service
            srv = rng.choice(servers)
            state = ServerState.READY if srv.state != ServerState.READY else ServerState.DRAINING
            Server.objects.filter(pk=srv.pk).update(state=state)
            srv.state = state
        elif kind == 4:  # a renamed server, and a telemetry update that the trigger skips
            srv = rng.choice(servers)
            Server.objects.filter(pk=srv.pk).update(hostname=f"renamed-{step}")
            Gpu.objects.filter(server=srv).update(telemetry={"DCGM_FI_DEV_GPU_UTIL": step})
        elif kind == 6:  # MIG mode on (booked by slices only), then off, then a GPU that cannot do MIG
            mig = [{"current": True, "pending": True}, {"current": False, "pending": False}, None][step % 3]
            Gpu.objects.filter(pk=gpu.pk).update(mig=mig)
        else:  # a GPU moved to another server, then one removed for good
            Gpu.objects.filter(pk=gpu.pk).update(server=rng.choice(servers), index=100 + step)
            if step % 12 == 5:
                Gpu.objects.filter(pk__in=Gpu.objects.order_by("?").values("pk")[:1]).delete()
        assert summary() == counted(), step
    Server.objects.filter(pk=servers[0].pk).delete()
    assert summary() == counted()
    Gpu.objects.all().delete()
    assert summary() == {}


def test_many_gpus_changed_in_one_statement_are_counted_once_each() -> None:
    model = gpu_model()
    srv = server(model, gpus=8)
    Gpu.objects.filter(server=srv, index__lt=5).update(health=GpuHealth.UNHEALTHY)
    assert summary()[(srv.pk, model.pk)][2:] == (3, 8)
    Gpu.objects.filter(server=srv).update(health=GpuHealth.HEALTHY)
    assert summary()[(srv.pk, model.pk)][2:] == (8, 8)


@pytest.mark.django_db(transaction=True)  # TRUNCATE, as the test database's flush does, outside a transaction
def test_a_truncated_gpu_table_empties_the_summary() -> None:
    server(gpu_model(), gpus=2)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE inventory_gpu CASCADE")
    assert summary() == {}


@pytest.mark.parametrize("seed", range(6))
def test_the_summary_read_shortlists_what_the_read_over_every_gpu_does(seed: int) -> None:
    rng = random.Random(seed)
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    model, other = gpu_model(), gpu_model("A100-40GB", memory_mib=40960)
    proj = project()
    for i in range(rng.randint(20, 40)):
        srv = server(model if rng.random() < 0.85 else other, gpus=rng.choice([2, 4, 8]), hostname=f"n{i:02d}")
        if rng.random() < 0.15:
            Server.objects.filter(pk=srv.pk).update(state=ServerState.MAINTENANCE)
    for gpu in Gpu.objects.all():
        if rng.random() < 0.1:
            Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.UNHEALTHY)
        if rng.random() < 0.05:
            Gpu.objects.filter(pk=gpu.pk).update(present=False)
        if rng.random() < 0.1:  # MIG mode on: booked by its slices, never whole
            Gpu.objects.filter(pk=gpu.pk).update(mig={"current": True, "pending": True})
        if rng.random() < 0.5:
            start = now + timedelta(hours=rng.randint(-2, 6))
            hold(gpu, start, start + timedelta(hours=rng.choice([1, 2, 3])), proj=proj, active=rng.random() > 0.1)
    # Cards moved to other servers with their bookings, some of them into servers of the other model: the
    # allocations follow their GPU, and a server of mixed models is counted from its GPUs.
    servers = list(Server.objects.all())
    for n, gpu in enumerate(Gpu.objects.order_by("?")[:6]):
        Gpu.objects.filter(pk=gpu.pk).update(server=rng.choice(servers), index=100 + n)
    assert not Allocation.objects.exclude(server_id=F("gpu__server_id")).exists()
    for count in (1, 2, 3, 4, 6, 8, 9):
        spec = GpuSpec(gpu_model_id=model.pk, gpu_count=count)
        for offset, hours in ((0, 1), (1, 2), (3, 1), (-1, 8)):
            window = Window(now + timedelta(hours=offset), now + timedelta(hours=offset + hours))
            full = _shortlist(spec, _server_counts(spec, window), SHORTLIST)
            fast = _fitting_from_summary(spec, window, SHORTLIST)
            if count > max((c.matching for c in _server_counts(spec, window)), default=0):
                assert fast is None  # more than one server holds: the read over every GPU answers
                continue
            assert fast == full, (count, offset, hours)
            assert candidate_servers(spec, window) == _build(spec, window, full)


def test_the_summary_read_leaves_other_specs_to_the_read_over_every_gpu() -> None:
    model = gpu_model()
    server(model, gpus=4)
    now = timezone.now()
    window = Window(now, now + timedelta(hours=1))
    assert _fitting_from_summary(GpuSpec(min_memory_mib=1, gpu_count=1), window, SHORTLIST) is None
    assert _fitting_from_summary(GpuSpec(gpu_model_id=model.pk, whole_servers=1), window, SHORTLIST) is None
