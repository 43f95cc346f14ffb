"""Builders for a small fleet, projects and grants, shared by the reservation and ledger tests."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from controlplane.accounts.choices import Role
from controlplane.accounts.models import Membership, Project
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Gpu, GpuModel, Server
from controlplane.ledger.services import ledger_grant, quota_policy_set
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window

_seq = itertools.count(1)


def gpu_model(name: str = "H100-80GB", memory_mib: int = 81920, weight: str = "1") -> GpuModel:
    model, _ = GpuModel.objects.get_or_create(
        name=name,
        defaults={
            "product_name": f"NVIDIA {name}",
            "memory_mib": memory_mib,
            "billing_weight": Decimal(weight),
            "price_per_gpu_hour": Decimal("2"),
        },
    )
    return model


def server(
    model: GpuModel,
    *,
    gpus: int = 8,
    state: str = ServerState.READY,
    hostname: str | None = None,
    nvlink_groups: list[list[int]] | None = None,
    numa: list[int] | None = None,
) -> Server:
    """A server with ``gpus`` GPUs; NVLink groups and NUMA nodes by GPU index (default: two halves)."""
    n = next(_seq)
    srv = Server.objects.create(hostname=hostname or f"gpu-{n:04d}", state=state)
    half = max(1, gpus // 2)
    groups = nvlink_groups if nvlink_groups is not None else [list(range(0, half)), list(range(half, gpus))]
    numa = numa if numa is not None else [0 if i < half else 1 for i in range(gpus)]
    uuids = [f"GPU-{n:04d}-{i:02d}" for i in range(gpus)]
    for i in range(gpus):
        peers = next((g for g in groups if i in g), [])
        Gpu.objects.create(
            server=srv,
            uuid=uuids[i],
            index=i,
            model=model,
            product_name=model.product_name,
            memory_mib=model.memory_mib,
            numa_node=numa[i],
            nvlink_peers=[uuids[j] for j in peers if j != i],
        )
    return srv


def project(
    *, owner: Any = None, member: Any = None, viewer: Any = None, grant: str | None = "100000", slug: str | None = None
) -> Project:
    n = next(_seq)
    proj = Project.objects.create(name=f"Project {n}", slug=slug or f"proj-{n}")
    for user, role in ((owner, Role.OWNER), (member, Role.MEMBER), (viewer, Role.VIEWER)):
        if user is not None:
            Membership.objects.create(project=proj, user=user, role=role)
    quota_policy_set(project=proj, actor=None, credits_per_period=Decimal("0"))
    if grant:
        ledger_grant(project=proj, amount=Decimal(grant), actor=None, reason="test credits")
    return proj


def hold(gpu: Gpu, start: datetime, end: datetime, *, proj: Project | None = None, active: bool = True) -> Allocation:
    """A one-GPU scheduled reservation holding ``gpu`` over ``[start, end)``, written straight to the tables
    (no placement, no quota): the searches' and placement's fixtures. ``active=False``: released, it holds
    nothing."""
    r = Reservation.objects.create(
        project=proj or project(),
        name="r",
        gpu_model=gpu.model,
        gpu_count=1,
        starts_at=start,
        ends_at=end,
        image="x",
        state=ReservationState.SCHEDULED,
    )
    return Allocation.objects.create(
        reservation=r, gpu=gpu, server_id=gpu.server_id, starts_at=start, ends_at=end, active=active
    )


def window(start_in: timedelta = timedelta(hours=1), hours: float = 2, *, now: datetime | None = None) -> Window:
    start = (now or timezone.now()) + start_in
    return Window(start, start + timedelta(hours=hours))


def spec(
    model: GpuModel | None = None, *, count: int | None = 1, whole: int | None = None, min_memory: int | None = None
) -> GpuSpec:
    return GpuSpec(
        gpu_model_id=model.pk if model else None,
        min_memory_mib=min_memory,
        gpu_count=None if whole else count,
        whole_servers=whole,
    )


CONTAINER = ContainerSpec(image="registry.example/train:1", command=["python", "train.py"], env={"EPOCHS": "3"})
