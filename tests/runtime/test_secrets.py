"""A launch's project secrets on a real engine: as env and as files under /run/secrets, readable by the container's
user whatever its uid and by nobody else on the host, never in a report, a log line or a repr, refused when they
would set the runtime's own variables, fixed for the launch, and gone from the host with it."""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from nodeagent import schema
from nodeagent.agent import AgentState
from nodeagent.runtime import secrets
from nodeagent.runtime.containers import safe_id
from nodeagent.runtime.docker import DockerRuntime

from .support import T0, ours, wait_for

pytestmark = pytest.mark.docker

HF = "hf_Sx9QmT3pLkV0aZ7-secret-for-tests"
WANDB = "wandb-0f1e2d3c4b5a-secret-for-tests"
SLEEP = ["sleep", "3600"]


def hf(value: str = HF, **overrides: object) -> schema.SecretValue:
    values: dict[str, object] = {"name": "hf_token", "value": value, "env": "HF_TOKEN", "file": True}
    values.update(overrides)
    return schema.SecretValue(**values)  # type: ignore[arg-type]


def wandb() -> schema.SecretValue:
    return schema.SecretValue(name="wandb", value=WANDB, file=True)


def container_of(docker_client, node: str, launch_id: str):  # type: ignore[no-untyped-def]
    [found] = [c for c in ours(docker_client, node) if c.labels["gpucp.launch_id"] == launch_id]
    return found


def inside(container, *argv: str, user: str = "") -> str:  # type: ignore[no-untyped-def]
    result = container.exec_run(list(argv), user=user)
    assert result.exit_code == 0, result.output
    return str(result.output.decode())


def launch_dir(runtime: DockerRuntime, launch_id: str) -> Path:
    return runtime.launch_root / safe_id(launch_id)


def report_for(runtime: DockerRuntime, launch_id: str) -> schema.ContainerReport:
    [found] = [r for r in runtime.report() if r.launch_id == launch_id]
    return found


def test_a_secret_reaches_the_container_as_env_and_as_a_file(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    plain = {"HF_TOKEN": "the tenant's plain value", "OTHER": "1"}
    spec = make_desired(command=SLEEP, env=plain, secrets=[hf(), wandb()])

    runtime.reconcile([spec], [], T0)

    container = container_of(docker_client, node, spec.launch_id)
    wait_for(lambda: container.reload() or container.status == "running", what="running")
    # The secret wins over the tenant's plain variable of the same name.
    assert inside(container, "sh", "-c", 'printf %s "$HF_TOKEN"') == HF
    assert inside(container, "sh", "-c", 'printf %s "$OTHER"') == "1"
    assert inside(container, "cat", "/run/secrets/hf_token") == HF
    assert inside(container, "cat", "/run/secrets/wandb") == WANDB
    # Only a file: no variable holds it.
    assert WANDB not in inside(container, "env")
    assert inside(container, "ls", "/run/secrets").split() == ["hf_token", "wandb"]
    # Read-only in the container.
    assert container.exec_run(["sh", "-c", "echo x > /run/secrets/hf_token"]).exit_code != 0
    [mount] = [m for m in container.attrs["Mounts"] if m["Destination"] == "/run/secrets"]
    assert mount["RW"] is False
    # The runtime's own variables are still its own.
    assert inside(container, "sh", "-c", 'printf %s "$GPUCP_RESERVATION"') == spec.reservation


def test_the_files_are_readable_by_any_uid_the_image_runs_as(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, docker_client, node, busybox_image
):
    # An image whose USER is neither root nor anyone the host knows, reading its secret at start-up.
    tag = f"gpucp-secrets-user:{uuid.uuid4().hex[:8]}"
    dockerfile = f"FROM {busybox_image}\nUSER 4321:4321\n".encode()
    docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
    try:
        runtime = make_runtime()
        spec = make_desired(
            image=tag,
            command=["sh", "-c", 'echo "uid=$(id -u) file=$(cat /run/secrets/hf_token)"; exec sleep 3600'],
            secrets=[hf()],
        )
        runtime.reconcile([spec], [], T0)
        container = container_of(docker_client, node, spec.launch_id)
        output = wait_for(lambda: "file=" in (out := container.logs().decode()) and out, what="the job's output")
        assert f"uid=4321 file={HF}" in output
        # And through exec as yet another user (what an SSH session of that image gets).
        assert inside(container, "cat", "/run/secrets/hf_token", user="65000:65000") == HF
    finally:
        for container in ours(docker_client, node):
            container.remove(force=True)
        docker_client.images.remove(tag, force=True)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as another user")
def test_no_other_user_of_the_host_can_read_the_files(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=SLEEP, secrets=[hf()])
    runtime.reconcile([spec], [], T0)

    barrier = launch_dir(runtime, spec.launch_id) / "secrets"
    path = secrets.files_dir(launch_dir(runtime, spec.launch_id)) / "hf_token"
    assert path.read_text() == HF
    assert stat.S_IMODE(barrier.stat().st_mode) == 0o700
    assert barrier.stat().st_uid == os.geteuid()
    # As "nobody", the host's unprivileged user: not readable, not even listable.
    attempt = (
        "import os, sys\n"
        "os.setgid(65534); os.setgroups([]); os.setuid(65534)\n"
        "for probe in (lambda: open(sys.argv[1]).read(), lambda: os.listdir(sys.argv[2])):\n"
        "    try:\n"
        "        probe(); print('READ')\n"
        "    except PermissionError:\n"
        "        print('denied')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", attempt, str(path), str(barrier)], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["denied", "denied"], result


def test_values_never_reach_a_report_a_log_line_or_a_repr(make_runtime, make_desired, docker_client, node, caplog):  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    runtime = make_runtime()
    job = make_desired(command=["sh", "-c", "exit 3"], secrets=[hf(), wandb()])
    refused = make_desired(secrets=[hf(env="GPUCP_RESERVATION")])

    runtime.reconcile([job, refused], [], T0)
    wait_for(lambda: report_for(runtime, job.launch_id).state == "exited", what="the job's exit")
    reports = [runtime.report() for _ in range(3)]
    runtime.reconcile([], [], T0 + timedelta(minutes=1))

    said = "\n".join(
        [
            caplog.text,
            *(report.model_dump_json() for batch in reports for report in batch),
            repr(job),
            repr(runtime._launches),
            repr(job.secrets),
            str(job),
        ]
    )
    assert HF not in said and WANDB not in said
    assert "GPUCP_RESERVATION" in said  # the refusal was said, naming the variable
    assert "hf_token" in repr(job.secrets)  # the secret is named where it is shown at all


RESERVED = ["NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPUCP_X"]


@pytest.mark.parametrize("variable", RESERVED)
def test_a_secret_may_not_set_the_runtimes_own_variables(make_runtime, make_desired, docker_client, node, variable):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(secrets=[hf(env=variable)])

    runtime.reconcile([spec], [], T0)
    assert runtime.wait_idle(30)

    report = report_for(runtime, spec.launch_id)
    assert report.state == "failed"
    assert report.error is not None
    assert report.error.startswith(f"secret hf_token may not set {variable}: the runtime sets that variable itself")
    assert HF not in report.error
    assert ours(docker_client, node) == []
    # Final: not tried again.
    runtime.reconcile([spec], [], T0 + timedelta(seconds=5))
    assert ours(docker_client, node) == []
    assert report_for(runtime, spec.launch_id).state == "failed"


def test_two_secrets_aimed_at_one_variable_are_refused(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(secrets=[hf(), schema.SecretValue(name="other", value=WANDB, env="HF_TOKEN")])
    runtime.reconcile([spec], [], T0)
    assert runtime.wait_idle(30)
    report = report_for(runtime, spec.launch_id)
    assert report.state == "failed" and report.error == "secrets hf_token and other both set HF_TOKEN"


def test_a_new_value_applies_from_the_next_launch_only(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    first = make_desired(command=SLEEP, secrets=[hf("first-value-1234")])
    runtime.reconcile([first], [], T0)

    # The project's secret changes while the launch runs: the launch keeps what it started with.
    changed = first.model_copy(update={"secrets": [hf("second-value-5678")]})
    runtime.reconcile([changed], [], T0 + timedelta(seconds=5))
    container = container_of(docker_client, node, first.launch_id)
    assert inside(container, "sh", "-c", 'printf %s "$HF_TOKEN"') == "first-value-1234"
    assert inside(container, "cat", "/run/secrets/hf_token") == "first-value-1234"
    # A restarted agent adopts it as it is.
    runtime.close()
    runtime = make_runtime()
    runtime.reconcile([changed], [], T0 + timedelta(seconds=10))
    assert inside(container, "cat", "/run/secrets/hf_token") == "first-value-1234"

    # The next launch gets the new value.
    following = make_desired(command=SLEEP, secrets=[hf("second-value-5678")])
    runtime.reconcile([changed, following], [], T0 + timedelta(seconds=15))
    container = container_of(docker_client, node, following.launch_id)
    assert inside(container, "sh", "-c", 'printf %s "$HF_TOKEN"') == "second-value-5678"
    assert inside(container, "cat", "/run/secrets/hf_token") == "second-value-5678"


def test_the_files_leave_the_host_when_the_launch_is_forgotten(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["true"], secrets=[hf()])
    runtime.reconcile([spec], [], T0)
    files = secrets.files_dir(launch_dir(runtime, spec.launch_id))
    assert (files / "hf_token").read_text() == HF

    wait_for(lambda: report_for(runtime, spec.launch_id).state == "exited", what="the job's exit")
    for _ in range(3):
        runtime.report()
    runtime.reconcile([], [], T0 + timedelta(minutes=1))

    assert not launch_dir(runtime, spec.launch_id).exists()
    assert ours(docker_client, node) == []


def test_a_launch_without_secrets_mounts_none(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=SLEEP)
    runtime.reconcile([spec], [], T0)
    container = container_of(docker_client, node, spec.launch_id)
    assert not [m for m in container.attrs["Mounts"] if m["Destination"] == "/run/secrets"]
    assert not (launch_dir(runtime, spec.launch_id) / "secrets").exists()


def test_the_held_desired_state_is_the_agents_alone(make_desired, tmp_path):  # type: ignore[no-untyped-def]
    directory = tmp_path / "agent-state"
    # Created first by someone else, with the usual umask (the runtime's and the journal's directories live here).
    (directory / "launches").mkdir(parents=True)
    os.chmod(directory, 0o755)  # noqa: S103 - what the agent must not leave as it is
    state = AgentState(directory)
    spec = make_desired(secrets=[hf()])

    state.save_desired(AgentState.desired_text([spec], []))

    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "desired.json").stat().st_mode) == 0o600
    # Kept whole (a restarted agent launches with it), and read back the same.
    held = state.desired()
    assert held is not None and held[0][0].secrets[0].value == HF
    assert json.loads((directory / "desired.json").read_text())["desired"][0]["secrets"][0]["value"] == HF
