"""``gpucp book --template NAME`` against a live server: the template fills what the options leave out."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from gpucp_support import Gpucp, World

from controlplane.reservations.models import Reservation
from controlplane.templates.models import LaunchTemplate

IMAGE = "gpucp-busybox:test"


@pytest.fixture
def train(world: World) -> LaunchTemplate:
    return LaunchTemplate.objects.create(
        project=world.project,
        name="train",
        container={"image": IMAGE, "command": ["sleep", "60"], "env": {"EPOCHS": "3"}, "network": "none"},
        spec={"gpu_model": "H100-80GB", "gpu_count": 1},
        duration_s=1800,
    )


def test_book_from_a_template_takes_its_defaults(gpucp: Gpucp, train: LaunchTemplate):
    result = gpucp("book", "--template", "train")
    assert result.exit_code == 0, result.output
    r = Reservation.objects.get()
    assert (r.template, r.name, r.image, r.command, r.gpu_count) == ("train", "train", IMAGE, ["sleep", "60"], 1)
    assert r.env == {"EPOCHS": "3"}
    assert r.ends_at - r.starts_at == timedelta(minutes=30)
    assert "template" in result.stdout and str(r.public_id) in result.stdout


def test_options_override_the_template(gpucp: Gpucp, train: LaunchTemplate):
    result = gpucp(
        "--json", "book", "-t", "train", "--gpus", "2", "--hours", "2", "--name", "big", "-e", "LR=0.1",
        "--", "sh", "-c", "true",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)
    assert detail["template"] == "train" and detail["name"] == "big"
    assert detail["spec"]["gpu_count"] == 2 and detail["spec"]["gpu_model"] == "H100-80GB"
    assert detail["command"] == ["sh", "-c", "true"] and detail["env"] == {"EPOCHS": "3", "LR": "0.1"}
    r = Reservation.objects.get()
    assert r.ends_at - r.starts_at == timedelta(hours=2)


def test_an_unknown_template_exits_1_naming_it(gpucp: Gpucp):
    result = gpucp("book", "--template", "nope")
    assert result.exit_code == 1
    assert "template" in result.stderr and "(unknown_template)" in result.stderr
    assert not Reservation.objects.exists()


def test_without_a_template_the_model_hours_and_image_are_needed(gpucp: Gpucp):
    result = gpucp("book", "--model", "H100-80GB")
    assert result.exit_code == 2
    assert "Give --hours, --image, or --template NAME." in result.stderr
    assert not Reservation.objects.exists()


def test_a_templates_ports_come_with_it_unless_port_gives_others(gpucp: Gpucp, train: LaunchTemplate):
    train.ports = [{"name": "jupyter", "port": 8888, "protocol": "http", "path": "/lab", "auth": "none"}]
    train.save(update_fields=["ports"])
    inherited = json.loads(gpucp("--json", "book", "-t", "train").stdout)
    assert inherited["ports"] == train.ports
    own = gpucp("--json", "book", "-t", "train", "--port", "web:8080")
    assert own.exit_code == 0, own.output
    assert json.loads(own.stdout)["ports"] == [
        {"name": "web", "port": 8080, "protocol": "http", "path": "/", "auth": "none"}
    ]
