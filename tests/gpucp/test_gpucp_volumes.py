"""``gpucp volumes ls``, ``create`` and ``rm``, and ``gpucp book --volume/--dataset/--network``, against a live
server."""

from __future__ import annotations

import json

from gpucp_support import Gpucp, World

from controlplane.access.datasets import dataset_create
from controlplane.access.models import GIB, Volume
from controlplane.access.volumes import project_network_set, volume_create
from controlplane.reservations.models import Reservation
from tests.factories import OperatorFactory

BOOK = ("book", "--model", "H100-80GB", "--hours", "1", "--image", "img:1")


def test_volumes_create_ls_and_rm(gpucp: Gpucp, world: World):
    assert gpucp("volumes", "ls").stdout.startswith("Project demo has no volumes")
    created = gpucp("volumes", "create", "data", "--size-gib", "20", "--shared")
    assert created.exit_code == 0, created.output
    assert created.stdout == "Created data (20 GiB, shared) in demo\n"
    Volume.objects.filter(name="data").update(used_bytes=6 * GIB)
    listed = gpucp("volumes", "ls")
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "LIMIT", "GIB", "USED", "SHARED", "MEASURED"]
    assert row.split()[:6] == ["data", "20", "6.0", "GiB", "[###-------]", "30%"]
    removed = gpucp("volumes", "rm", "data")
    assert removed.exit_code == 0 and "its data on disk is left as it was" in removed.stdout
    assert not Volume.objects.exists()


def test_volumes_json_and_the_apis_refusals(gpucp: Gpucp, world: World):
    data = json.loads(gpucp("--json", "volumes", "create", "scratch", "--size-gib", "1").stdout)
    assert (data["name"], data["limit_bytes"], data["shared"]) == ("scratch", GIB, False)
    assert json.loads(gpucp("--json", "volumes", "ls").stdout)["results"][0]["name"] == "scratch"
    bad = gpucp("--json", "volumes", "create", "Bad", "--size-gib", "1")
    assert bad.exit_code == 1 and list(json.loads(bad.stderr)["error"]["fields"]) == ["name"]
    missing = gpucp("volumes", "rm", "nope")
    assert missing.exit_code == 4
    assert gpucp("volumes", "ls", "--project", "someone-elses").exit_code == 4


def test_rm_of_a_mounted_volume_is_refused(gpucp: Gpucp, world: World):
    volume_create(project=world.project, name="data", size_limit_gib=5, actor=world.owner)
    assert gpucp(*BOOK, "--volume", "data").exit_code == 0
    refused = gpucp("volumes", "rm", "data")
    assert refused.exit_code == 1 and refused.stderr.rstrip().endswith("(volume_in_use)")
    assert Volume.objects.filter(name="data").exists()


def test_book_mounts_volumes_and_datasets_and_asks_for_egress(gpucp: Gpucp, world: World):
    volume_create(project=world.project, name="data", size_limit_gib=5, actor=world.owner)
    volume_create(project=world.project, name="ckpt", size_limit_gib=5, actor=world.owner)
    dataset_create(name="imagenet", allowed_projects=[world.project], actor=None)
    project_network_set(project=world.project, network_name="demo-egress", actor=OperatorFactory())
    result = gpucp(
        "--json", *BOOK, "--volume", "data", "--volume", "ckpt:/ckpt:ro", "--dataset", "imagenet",
        "--dataset", "imagenet2:/in", "--network", "egress",
    )  # fmt: skip
    # imagenet2 does not exist: refused, naming the fourth mount.
    assert result.exit_code == 1
    assert list(json.loads(result.stderr)["error"]["fields"]) == ["container.volumes.3.dataset"]
    result = gpucp(
        "--json", *BOOK, "--volume", "data", "--volume", "ckpt:/ckpt:ro", "--dataset", "imagenet:/in",
        "--network", "egress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)
    assert detail["volumes"] == [
        {"kind": "volume", "name": "data", "path": "/workspace", "read_only": False},
        {"kind": "volume", "name": "ckpt", "path": "/ckpt", "read_only": True},
        {"kind": "dataset", "name": "imagenet", "path": "/in", "read_only": True},
    ]
    assert detail["network"] == "egress"
    assert Reservation.objects.get(public_id=detail["id"]).network == "egress"


def test_book_refuses_a_malformed_mount_before_sending(gpucp: Gpucp, world: World):
    for flag, value in (("--volume", ":/x"), ("--volume", "a:/x:/y"), ("--dataset", "d:")):
        result = gpucp(*BOOK, flag, value, token=None)  # not sent: no token needed to be refused
        assert result.exit_code == 2, result.output
    assert not Reservation.objects.exists()
