"""``manage.py runsystem`` gives its simulated agents one volume root, as shared storage does for real servers."""

from __future__ import annotations

from pathlib import Path

from controlplane.core.management.commands.runsystem import Command, FleetMember
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
