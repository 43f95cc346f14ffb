"""`python -m nodeagent run` starts the signed command listener, reports its URL, and acts on what it is sent.

The agent runs as a real subprocess (simulated GPUs, no container runtime) against a control plane double on a
real socket, so the flags, the environment default and the wiring between listener and loop are all the
shipped ones.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from nodeagent import commands, schema
from nodeagent.__main__ import main, parse_listen
from tests.nodeagent.control_plane_double import ControlPlaneDouble
from tests.runtime import support

ROOT = Path(__file__).resolve().parents[2]


# The agent's loop and the broker add their own latency: wait a little longer, poll a little faster.
wait_for = functools.partial(support.wait_for, timeout=20.0, interval=0.05)


@pytest.fixture
def double() -> Iterator[ControlPlaneDouble]:
    cp = ControlPlaneDouble(heartbeat_interval_s=1.0)  # its replies never name a launch: only a push can
    yield cp
    cp.close()


def start_agent(double: ControlPlaneDouble, tmp_path: Path, *extra: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    args = [sys.executable, "-m", "nodeagent", "run", "--server", double.url, "--join-token", "join-123"]
    args += ["--simulate", "2xH100-80GB", "--hostname", "cli-node", "--state-dir", str(tmp_path / "state")]
    args += ["--runtime", "none", "--interval", "0.5", *extra]
    full_env = {key: value for key, value in os.environ.items() if not key.startswith("NODEAGENT_")}
    full_env.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.Popen(args, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(process: subprocess.Popen) -> str:  # type: ignore[type-arg]
    process.terminate()
    out, _ = process.communicate(timeout=15)
    assert process.returncode == 0, out
    return out


def reported_facts(double: ControlPlaneDouble) -> dict[str, Any]:
    return wait_for(lambda: double.accepted and double.accepted[-1]["node"], what="a heartbeat")


def test_run_listens_by_default_reports_the_url_and_acts_on_a_signed_push(double, tmp_path):
    process = start_agent(double, tmp_path)
    try:
        url = reported_facts(double)["command_url"]
        assert url.startswith("http://127.0.0.1:") and url.endswith(commands.COMMAND_PATH)
        assert not url.startswith("http://127.0.0.1:0/")
        now = datetime.now(UTC)
        item = schema.DesiredContainer(
            launch_id="pushed-1",
            reservation="res-1",
            project="p",
            image="img",
            gpu_uuids=["GPU-00000000-0000-0000-0000-000000000001"],
            window_start=now,
            window_end=now + timedelta(minutes=5),
        )
        command = commands.new_command(server="cli-node", desired=[item], stop=[])
        body, headers = commands.signed_request(key=commands.signing_key(double.credential), command=command)
        forged = dict(headers, **{commands.HEADER_SIGNATURE: "0" * 64})
        assert requests.post(url, data=body, headers=forged, timeout=5).status_code == 401
        assert requests.post(url, data=body, headers=headers, timeout=5).status_code == 202
        # The double's replies want nothing, so a report of this launch can only come from the push reaching
        # the runtime (none here, and it says so); the next heartbeat carries it.
        report = wait_for(
            lambda: [c for hb in double.accepted for c in hb["containers"] if c["launch_id"] == "pushed-1"],
            timeout=10,
            what="the pushed launch in a heartbeat",
        )
        assert report[0]["state"] == "failed" and "runtime" in report[0]["error"]
    finally:
        stop(process)


def test_listen_address_comes_from_the_environment(double, tmp_path):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = start_agent(double, tmp_path, env={"NODEAGENT_LISTEN": f"127.0.0.1:{port}"})
    try:
        assert reported_facts(double)["command_url"] == f"http://127.0.0.1:{port}{commands.COMMAND_PATH}"
    finally:
        stop(process)


def test_no_listen_reports_no_command_url(double, tmp_path):
    process = start_agent(double, tmp_path, "--no-listen")
    try:
        assert reported_facts(double)["command_url"] is None
    finally:
        stop(process)


def test_a_bad_listen_address_exits_2_naming_the_flag(double, tmp_path, capsys):
    code = main(["run", "--server", double.url, "--join-token", "t", "--simulate", "1xL40S", "--listen", "nowhere"])
    assert code == 2
    assert "--listen" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:0", ("127.0.0.1", 0)), ("0.0.0.0:7070", ("0.0.0.0", 7070)), ("[::1]:9", ("::1", 9))],  # noqa: S104
)
def test_parse_listen_accepts_host_and_port(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["7070", ":7070", "host:http", "host:70000"])
def test_parse_listen_refuses_what_is_not_host_and_port(value):
    with pytest.raises(ValueError, match="--listen"):
        parse_listen(value)
