"""``manage.py runsystem`` gives its simulated agents one volume root, as shared storage does for real servers."""

from __future__ import annotations

from pathlib import Path

from controlplane.system.management.commands.runsystem import Command, FleetMember
from nodeagent.__main__ import build_parser


def test_every_local_agent_gets_the_same_volume_root_under_the_var_directory(settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.VAR_DIR = tmp_path
    members = [FleetMember("sim-a", 2, "H100-80GB"), FleetMember("sim-b", 4, "A100-40GB")]

    parsed = [
        build_parser().parse_args(Command.agent_argv(m, url="http://127.0.0.1:1", use_docker=True)[3:]) for m in members
    ]

    roots = {args.volume_root for args in parsed}
    assert roots == {str(Path(tmp_path) / "volumes")}
    assert Path(roots.pop()).is_dir()  # VolumeStore never creates its root, so runsystem must
    assert {args.state_dir for args in parsed} == {
        str(tmp_path / "agents" / "sim-a"),
        str(tmp_path / "agents" / "sim-b"),
    }


def test_two_systems_on_one_host_keep_their_agents_off_each_others_containers(settings, tmp_path):  # type: ignore[no-untyped-def]
    """The demo's hostnames are the same in every checkout; the container scope (from the var directory) is not."""
    from nodeagent.__main__ import container_owner

    member = FleetMember("sim-h100-01", 8, "H100-80GB")

    def owner(var: Path) -> str:
        settings.VAR_DIR = var
        args = build_parser().parse_args(Command.agent_argv(member, url="http://127.0.0.1:1", use_docker=True)[3:])
        return container_owner(args.hostname, args.container_scope)

    first, second = owner(tmp_path / "one"), owner(tmp_path / "two")
    assert first != second
    assert first.endswith("/sim-h100-01") and second.endswith("/sim-h100-01")
    assert owner(tmp_path / "one") == first  # a restarted system finds its own containers again
    # A real server's agent, with no scope, labels its containers with its hostname alone, as before.
    assert container_owner("gpu-017", None) == "gpu-017"
