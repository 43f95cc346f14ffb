"""The operator-wide templates the project ships: present after migrating, valid by the booking's own rules,
loaded once (an operator's change or deletion stays), and bookable."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.utils import timezone

from controlplane.templates import services
from controlplane.templates.models import LaunchTemplate
from controlplane.templates.shipped import JUPYTERLAB_BEFORE_PROXY, SHIPPED, load
from nodeagent import imageref
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db
NAMES = {"pytorch", "jupyterlab", "vllm"}


def test_the_shipped_templates_are_present_and_valid():
    shipped = {t.name: t for t in LaunchTemplate.objects.filter(project__isnull=True, name__in=NAMES)}
    assert set(shipped) == NAMES
    assert shipped["pytorch"].container["image"].startswith("nvcr.io/nvidia/pytorch:")
    assert shipped["jupyterlab"].ports == [
        {"name": "jupyter", "port": 8888, "protocol": "http", "path": "/lab", "auth": "jupyter"}
    ]
    assert shipped["vllm"].container["image"].startswith("vllm/vllm-openai:v")
    assert shipped["vllm"].ports == [{"name": "api", "port": 8000, "protocol": "http", "path": "/docs", "auth": "none"}]
    staff = OperatorFactory()
    for name, template in shipped.items():
        # Each image reference by the one rule, with a pinned tag (never "latest" alone).
        ref = template.container["image"]
        assert imageref.problem(ref) is None, (name, ref)
        assert not ref.endswith(":latest"), ref
        # Read again as a new template would be, by the booking's container and spec serializers.
        body = services.as_request(template)
        body["name"] = f"{name}-copy"
        values = services.read(body, user=staff)
        assert values["container"]["image"] == ref and values["spec"] == template.spec


def test_the_migration_loads_them_once_and_leaves_an_operators_changes(django_db_blocker):  # type: ignore[no-untyped-def]
    migration = importlib.import_module("controlplane.templates.migrations.0002_shipped_templates")
    LaunchTemplate.objects.filter(name__in=NAMES, project__isnull=True).delete()
    migration.load_shipped(apps, None)
    assert set(LaunchTemplate.objects.filter(project__isnull=True).values_list("name", flat=True)) >= NAMES
    LaunchTemplate.objects.filter(name="pytorch").update(title="Ours")
    LaunchTemplate.objects.filter(name="vllm").delete()
    LaunchTemplate.objects.create(project=None, name="vllm", container={"image": "example/own:1"})
    assert load(LaunchTemplate, now=timezone.now()) == 0
    assert LaunchTemplate.objects.get(name="pytorch").title == "Ours"
    assert LaunchTemplate.objects.get(name="vllm", project__isnull=True).container == {"image": "example/own:1"}
    assert len(SHIPPED) == 3


def test_the_jupyterlab_template_shipped_before_the_proxy_opens_signed_in_unless_an_operator_changed_it():
    migration = importlib.import_module("controlplane.templates.migrations.0003_jupyterlab_opens_in_the_proxy")
    LaunchTemplate.objects.filter(name="jupyterlab", project__isnull=True).update(**JUPYTERLAB_BEFORE_PROXY)
    migration.update_shipped(apps, None)
    lab = LaunchTemplate.objects.get(name="jupyterlab", project__isnull=True)
    assert lab.ports[0]["auth"] == "jupyter" and "signs you in" in lab.description
    LaunchTemplate.objects.filter(pk=lab.pk).update(**{**JUPYTERLAB_BEFORE_PROXY, "description": "Ours"})
    migration.update_shipped(apps, None)
    assert LaunchTemplate.objects.get(pk=lab.pk).ports == JUPYTERLAB_BEFORE_PROXY["ports"]


def test_a_shipped_template_books(api_client):  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=8)
    user = UserFactory()
    proj = project(member=user)
    api_client.force_authenticate(user)
    start = (timezone.now() + timedelta(hours=1)).isoformat()
    body = {"project": proj.slug, "name": "nb", "template": "jupyterlab", "window": {"start": start}}
    response = api_client.post("/api/v1/reservations/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["image"].startswith("quay.io/jupyter/pytorch-notebook:")
    assert response.json()["template"] == "jupyterlab"
