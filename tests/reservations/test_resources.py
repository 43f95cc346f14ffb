"""What a container gets of its server besides its GPUs (controlplane/reservations/resources.py): the one
function, the reservation's answer, and the desired state sent to the agent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch import reports
from controlplane.dispatch import services as dispatch
from controlplane.dispatch.models import Launch
from controlplane.inventory.models import Server
from controlplane.reservations.resources import Policy, container_resources, parse_ulimits, policy
from nodeagent.schema import Ulimit
from tests.dispatch.support import book, report
from tests.factories import UserFactory
from tests.reservations.fleet import gpu_model, project, server

GIB = 1024**3
MIB = 1024**2
# A DGX-like server: 8 GPUs, 224 cores, 2 TiB of memory.
FACTS = {"cpu_count": 224, "memory_bytes": 2048 * GIB, "pulls": True}
ULIMITS = [{"name": "memlock", "soft": -1, "hard": -1}, {"name": "stack", "soft": 67108864, "hard": 67108864}]


def test_two_of_eight_gpus_get_a_quarter_of_the_cores_and_of_the_memory():
    resources, memory = container_resources(held_slices=2 * 8, server_gpus=8, facts=FACTS)
    assert resources.cpus == 224 // 4
    # A quarter of what is left after the system's 10%.
    assert memory == int(2048 * GIB * 0.9 / 4 / MIB)
    # /dev/shm: half the memory share, bounded by the maximum (64 GiB).
    assert resources.shm_size_mib == 65536
    assert [u.model_dump() for u in resources.ulimits] == ULIMITS
    whole, whole_memory = container_resources(held_slices=64, server_gpus=8, facts=FACTS)
    assert whole.cpus == 224 and whole_memory == int(2048 * GIB * 0.9 / MIB)


def test_a_mig_slice_gets_its_memory_slices_share():
    # A 1g.10gb slice: one of a GPU's 8 memory slices, on an 8-GPU server: 1/64.
    resources, memory = container_resources(held_slices=1, server_gpus=8, facts=FACTS)
    assert resources.cpus == 224 // 64 == 3
    assert memory == int(2048 * GIB * 0.9 / 64 / MIB)
    assert resources.shm_size_mib == memory // 2
    # A 3g.40gb slice (4 memory slices) on a 4-GPU server with 16 cores: 1/8 of them.
    small, small_memory = container_resources(
        held_slices=4, server_gpus=4, facts={"cpu_count": 16, "memory_bytes": 64 * GIB}
    )
    assert small.cpus == 2 and small_memory == int(64 * GIB * 0.9 / 8 / MIB)
    # Never below one core; /dev/shm never below its minimum nor above the memory limit.
    tiny, tiny_memory = container_resources(held_slices=1, server_gpus=8, facts={"cpu_count": 8, "memory_bytes": GIB})
    assert tiny.cpus == 1 and tiny.shm_size_mib == tiny_memory == int(GIB * 0.9 / 64 / MIB)


def test_unknown_facts_limit_nothing_and_keep_shm_and_ulimits():
    for facts in (None, {}, {"cpu_count": None, "memory_bytes": None}, {"cpu_count": 0, "memory_bytes": 0}):
        resources, memory = container_resources(held_slices=16, server_gpus=8, facts=facts)
        assert resources.cpus is None and memory is None
        assert resources.shm_size_mib == 8192
        assert [u.model_dump() for u in resources.ulimits] == ULIMITS
    # A server whose GPUs are unknown gives no share either.
    resources, memory = container_resources(held_slices=16, server_gpus=0, facts=FACTS)
    assert resources.cpus is None and memory is None


def test_the_operators_policy():
    rules = Policy(cpu="none", memory="none", ulimits=())
    resources, memory = container_resources(held_slices=16, server_gpus=8, facts=FACTS, rules=rules)
    assert resources.cpus is None and memory is None and resources.ulimits == []
    assert resources.shm_size_mib == 65536  # still sized from the share
    with override_settings(
        CONTAINER_SYSTEM_CPUS=24,
        CONTAINER_SYSTEM_MEMORY_FRACTION=0.5,
        CONTAINER_SHM_FRACTION=0.25,
        CONTAINER_SHM_MAX_MIB=1_000_000,
        CONTAINER_ULIMITS="memlock=-1, nofile=1048576:1048576",
    ):
        resources, memory = container_resources(held_slices=16, server_gpus=8, facts=FACTS)
    assert resources.cpus == 200 // 4 and memory == int(1024 * GIB / 4 / MIB)
    assert resources.shm_size_mib == memory // 4
    assert resources.ulimits == [
        Ulimit(name="memlock", soft=-1, hard=-1),
        Ulimit(name="nofile", soft=1048576, hard=1048576),
    ]


@pytest.mark.parametrize("text", ["memlock", "stack=big", "fsize=1", "memlock=-2"])
def test_a_bad_ulimit_setting_is_refused_naming_it(text):
    with pytest.raises(ImproperlyConfigured, match="CONTAINER_ULIMITS"):
        parse_ulimits(text)


def test_a_bad_policy_is_refused_naming_it():
    with override_settings(CONTAINER_CPU_POLICY="half"), pytest.raises(ImproperlyConfigured, match="CONTAINER_CPU"):
        policy()


# --- the reservation's answer and the desired state ----------------------------------------------------------


@pytest.mark.django_db
def test_the_reservation_answer_shows_what_the_container_gets(api_client):  # type: ignore[no-untyped-def]
    model = gpu_model()
    srv = server(model, gpus=8)
    Server.objects.filter(pk=srv.pk).update(facts=FACTS)
    unknown = server(gpu_model("A100-40GB", memory_mib=40960), gpus=4)
    user = UserFactory()
    proj = project(member=user)
    api_client.force_authenticate(user)
    start = (timezone.now() + timedelta(hours=1)).isoformat()
    body = {
        "project": proj.slug,
        "name": "two",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 2},
        "window": {"start": start, "duration": "1h"},
        "container": {"image": "registry.example/train:1"},
    }
    booked = api_client.post("/api/v1/reservations/", body, format="json")
    assert booked.status_code == 201, booked.content
    expected = [
        {
            "server": srv.hostname,
            "gpu_share": 0.25,
            "cpus": 56,
            "memory_mib": int(2048 * GIB * 0.9 / 4 / MIB),
            "shm_mib": 65536,
            "ulimits": ULIMITS,
            "notes": [],
        }
    ]
    assert booked.json()["container_resources"] == expected
    assert api_client.get(f"/api/v1/reservations/{booked.json()['id']}/").json()["container_resources"] == expected
    body.update(name="a100", spec={"gpu_model": "A100-40GB", "gpu_count": 1})
    other = api_client.post("/api/v1/reservations/", body, format="json").json()["container_resources"]
    assert other[0]["server"] == unknown.hostname and other[0]["gpu_share"] == 0.25
    assert other[0]["cpus"] is None and other[0]["memory_mib"] is None and other[0]["shm_mib"] == 8192
    assert other[0]["notes"] == [
        "The server has not reported its CPU count: the container's CPUs are not limited.",
        "The server has not reported its memory: the container's memory is not limited.",
    ]


@pytest.mark.django_db
def test_the_desired_state_carries_the_resources_of_each_running_launch(django_assert_max_num_queries):  # type: ignore[no-untyped-def]
    model = gpu_model()
    srv = server(model, gpus=8)
    Server.objects.filter(pk=srv.pk).update(facts=FACTS)
    srv.refresh_from_db()
    proj = project()
    two, one = book(proj, model, count=2), book(proj, model, count=1)
    dispatch.dispatch_open_due(now=timezone.now())
    launches = {launch.reservation_id: launch for launch in Launch.objects.filter(server=srv)}
    now = timezone.now()
    reports.containers_reported(
        server=srv, now=now, reports=[report(launch, "running", started_at=now) for launch in launches.values()]
    )
    with django_assert_max_num_queries(5):
        desired, stop = dispatch.node_desired_state(server=srv, now=now)
    assert stop == []
    by_reservation = {d.reservation: d for d in desired}
    quarter = by_reservation[str(two.public_id)]
    assert quarter.resources is not None and quarter.resources.cpus == 56
    assert quarter.memory_limit_mib == int(2048 * GIB * 0.9 / 4 / MIB)
    assert quarter.resources.shm_size_mib == 65536
    assert [u.model_dump() for u in quarter.resources.ulimits] == ULIMITS
    eighth = by_reservation[str(one.public_id)]
    assert eighth.resources is not None and eighth.resources.cpus == 28
    assert eighth.memory_limit_mib == int(2048 * GIB * 0.9 / 8 / MIB)
    # On the wire, as the agent reads it.
    wire = quarter.model_dump(mode="json")
    assert wire["resources"]["cpus"] == 56 and wire["memory_limit_mib"] == quarter.memory_limit_mib
    # An agent that does not say it applies them (NodeFacts.pulls) is sent none: an older one would refuse the field.
    Server.objects.filter(pk=srv.pk).update(facts={**FACTS, "pulls": False})
    srv.refresh_from_db()
    desired, _ = dispatch.node_desired_state(server=srv, now=now)
    assert all(d.resources is None and d.memory_limit_mib is None for d in desired)
    assert all("resources" not in d.model_dump(mode="json") for d in desired)
