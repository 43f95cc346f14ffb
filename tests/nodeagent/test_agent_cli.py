"""``python -m nodeagent probe`` and ``run`` as an operator uses them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pynvml
from control_plane_double import ControlPlaneDouble
from nvml_fakes import FakeNvml

from nodeagent.__main__ import main
from nodeagent.probe import ProbeReport


def test_probe_simulated_prints_a_table_labelled_simulated(capsys):
    assert main(["probe", "--simulate", "4xA100-40GB", "--hostname", "sim-a100"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("sim-a100 (SIMULATED): backend simulated")
    assert out.count("NVIDIA A100-SXM4-40GB") == 4
    assert "PCI BUS ID" in out and "40960 MiB" in out


def test_probe_json_is_a_valid_report(capsys):
    assert main(["probe", "--simulate", "2xH200-141GB", "--hostname", "sim-h200", "--json"]) == 0
    report = ProbeReport.model_validate_json(capsys.readouterr().out)
    assert report.simulated and [g.name for g in report.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert len(report.samples) == 2


def test_probe_with_a_bad_spec_exits_2_naming_the_problem(capsys):
    assert main(["probe", "--simulate", "8xH900"]) == 2
    assert "unknown GPU model 'H900'" in capsys.readouterr().err


def test_probe_without_nvml_exits_2_and_suggests_simulate(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert main(["probe"]) == 2
    err = capsys.readouterr().err
    assert "NVML is not available" in err and "--simulate" in err


def test_probe_json_shows_mig_devices_and_the_vendor(capsys):
    assert main(["probe", "--simulate", "1xH100-80GB:mig=3g.40gb+2x2g.20gb", "--hostname", "sim-mig", "--json"]) == 0
    raw = json.loads(capsys.readouterr().out)
    (gpu,) = raw["gpus"]
    assert "vendor" not in gpu  # NVIDIA: the field keeps its default out of the JSON
    assert gpu["mig"]["current"] is True
    assert sorted(d["profile"] for d in gpu["mig"]["devices"]) == ["2g.20gb", "2g.20gb", "3g.40gb"]
    assert main(["probe", "--simulate", "2xMI300X", "--hostname", "sim-amd", "--json"]) == 0
    assert {g["vendor"] for g in json.loads(capsys.readouterr().out)["gpus"]} == {"amd"}


def test_probe_table_shows_vendor_and_one_line_per_mig_device(capsys):
    assert main(["probe", "--simulate", "1xA100-80GB:mig=2x3g.40gb", "--hostname", "sim-mig"]) == 0
    out = capsys.readouterr().out
    assert "VENDOR" in out and "on, 2 devices" in out
    assert out.count("MIG 3g.40gb MIG-") == 2


def test_probe_with_the_amdsmi_backend_reads_amd_gpus(capsys, monkeypatch):
    from amdsmi_fakes import FakeAmdsmi, mi300x_pair

    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdsmi(list(mi300x_pair())))
    assert main(["probe", "--backend", "amdsmi", "--hostname", "amd-01", "--json"]) == 0
    report = ProbeReport.model_validate_json(capsys.readouterr().out)
    assert report.node.backend == "amdsmi" and not report.simulated
    assert [g.vendor for g in report.gpus] == ["amd", "amd"]


def test_probe_runs_as_a_module(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "nodeagent", "probe", "--simulate", "1xL40S", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["gpus"][0]["name"] == "NVIDIA L40S"


def test_run_needs_a_server(capsys, monkeypatch):
    monkeypatch.delenv("NODEAGENT_SERVER", raising=False)
    assert main(["run", "--simulate", "1xL40S"]) == 2
    assert "--server" in capsys.readouterr().err


def test_run_without_token_or_credential_exits_2(control_plane: ControlPlaneDouble, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NODEAGENT_JOIN_TOKEN", raising=False)
    code = main(["run", "--server", control_plane.url, "--simulate", "1xL40S", "--state-dir", str(tmp_path)])
    assert code == 2 and "no node credential" in capsys.readouterr().err


def test_run_with_a_revoked_credential_exits_3_with_instructions(
    control_plane: ControlPlaneDouble, tmp_path, capsys, monkeypatch
):
    (tmp_path / "credential").write_text("an-old-credential\n")
    (tmp_path / "credential").chmod(0o600)
    monkeypatch.setenv("NODEAGENT_SERVER", control_plane.url)
    code = main(["run", "--simulate", "1xL40S", "--state-dir", str(tmp_path), "--hostname", "node-z"])
    assert code == 3
    assert "Re-enroll with a new --join-token" in capsys.readouterr().err
    assert control_plane.received[0].headers["Authorization"] == "Bearer an-old-credential"


def test_run_with_a_bad_registry_mirror_exits_2_naming_the_flag(capsys, tmp_path):
    argv = ["run", "--server", "http://127.0.0.1:9", "--simulate", "1xH100-80GB", "--state-dir", str(tmp_path)]
    assert main([*argv, "--registry-mirror", "docker.io"]) == 2
    assert "--registry-mirror" in capsys.readouterr().err
    assert main([*argv, "--image-cache-bytes", "-1"]) == 2
    assert "--image-cache-bytes must be 0 or more" in capsys.readouterr().err


def test_registry_mirrors_are_read_as_the_image_reference_rule_names_registries():
    from nodeagent.runtime.images import parse_mirror

    assert parse_mirror("docker.io=127.0.0.1:5001") == ("docker.io", "127.0.0.1:5001")
    assert parse_mirror("index.docker.io=mirror.internal") == ("docker.io", "mirror.internal")
    assert parse_mirror("nvcr.io=localhost:5002") == ("nvcr.io", "localhost:5002")
