"""``manage.py runsystem``: the fleet and bind parsing, the demo data, the supervisor, and the whole system."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from controlplane.core.management.commands.runsystem import FleetMember, parse_bind, parse_fleet, portal_is_stale
from controlplane.core.management.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent


# --- parsing --------------------------------------------------------------------------------------------


def test_fleet_is_read_as_hosts_with_gpu_specs():
    assert parse_fleet("sim-h100-01=8xH100-80GB, sim-a100-01=4xA100-40GB,") == [
        FleetMember("sim-h100-01", 8, "H100-80GB"),
        FleetMember("sim-a100-01", 4, "A100-40GB"),
    ]


@pytest.mark.parametrize("raw", ["sim-01", "sim-01=H100", "sim-01=0xH100-80GB", "Sim_01=8xH100-80GB", "=8xH100"])
def test_a_malformed_fleet_entry_is_refused_naming_the_variable(raw):
    with pytest.raises(CommandError, match="RUNSYSTEM_FLEET"):
        parse_fleet(raw)


def test_a_host_named_twice_in_the_fleet_is_refused():
    with pytest.raises(CommandError, match="appears twice"):
        parse_fleet("a=1xH100-80GB,a=2xH100-80GB")


def test_bind_port_flag_overrides_the_port_of_the_bind_setting():
    assert parse_bind("127.0.0.1:8000", None) == ("127.0.0.1", 8000)
    assert parse_bind("0.0.0.0:8000", 9000) == ("0.0.0.0", 9000)  # noqa: S104 - parsing, not binding
    with pytest.raises(CommandError, match="RUNSYSTEM_BIND"):
        parse_bind("8000", None)


def test_the_portal_is_rebuilt_only_when_a_source_changed_since_the_build(tmp_path):
    def write(relative: str, mtime: float) -> None:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
        os.utime(path, (mtime, mtime))

    write("src/main.tsx", 1000)
    assert portal_is_stale(tmp_path), "never built"
    write("dist/index.html", 2000)
    write("node_modules/react/index.js", 3000)  # an installed package is not a source
    assert not portal_is_stale(tmp_path)
    write("src/pages/Reservations.tsx", 3000)
    assert portal_is_stale(tmp_path)


# --- demo data ------------------------------------------------------------------------------------------


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return tmp_path


def test_demo_data_is_created_once_and_a_second_run_changes_nothing(db, var_dir, monkeypatch):
    from django.contrib.auth import get_user_model

    from controlplane.accounts.choices import Role
    from controlplane.accounts.models import Membership
    from controlplane.core.management.demo import seed_demo
    from controlplane.inventory.models import GpuModel

    monkeypatch.delenv("DEMO_OPERATOR_PASSWORD", raising=False)
    monkeypatch.delenv("DEMO_TENANT_PASSWORD", raising=False)
    first = seed_demo()
    second = seed_demo()

    users = get_user_model().objects
    operator = users.get(username="operator")
    assert operator.is_staff and operator.is_superuser
    alice = users.get(username="alice")
    assert not alice.is_staff
    assert Membership.objects.get(user=alice, project__slug="demo").role == Role.OWNER
    assert users.count() == 2
    assert set(GpuModel.objects.values_list("name", "memory_mib")) == {("H100-80GB", 81559), ("A100-40GB", 40960)}
    # The generated passwords work, and the second run shows the same ones instead of resetting them.
    for login_first, login_second in zip(first.logins, second.logins, strict=True):
        assert login_first.password and login_first.password == login_second.password
        assert users.get(username=login_first.username).check_password(login_first.password)


def test_demo_password_from_the_environment_is_applied(db, var_dir, monkeypatch):
    from django.contrib.auth import get_user_model

    from controlplane.core.management.demo import seed_demo

    monkeypatch.setenv("DEMO_OPERATOR_PASSWORD", "correct horse battery")
    seed_demo()
    assert get_user_model().objects.get(username="operator").check_password("correct horse battery")


def test_demo_does_not_show_a_password_changed_since_it_was_set(db, var_dir, monkeypatch):
    from django.contrib.auth import get_user_model

    from controlplane.core.management.demo import seed_demo

    monkeypatch.delenv("DEMO_TENANT_PASSWORD", raising=False)
    seed_demo()
    alice = get_user_model().objects.get(username="alice")
    alice.set_password("changed by alice herself")
    alice.save()
    again = {login.username: login.password for login in seed_demo().logins}
    assert again["alice"] is None
    alice.refresh_from_db()
    assert alice.check_password("changed by alice herself")


def test_demo_keeps_a_price_the_operator_changed(db, var_dir):
    from controlplane.core.management.demo import seed_demo
    from controlplane.inventory.models import GpuModel

    seed_demo()
    GpuModel.objects.filter(name="H100-80GB").update(price_per_gpu_hour=Decimal("9.99"))
    seed_demo()
    assert GpuModel.objects.get(name="H100-80GB").price_per_gpu_hour == Decimal("9.99")


def test_demo_project_gets_a_quota_policy_and_credits_once(db, var_dir):
    from controlplane.core.management.demo import DEMO_CREDITS_PER_PERIOD, DEMO_MAX_CONCURRENT_GPUS, seed_demo
    from controlplane.ledger.models import LedgerEntry, QuotaPolicy

    seed_demo()
    seed_demo()
    policy = QuotaPolicy.objects.get(project__slug="demo")
    assert policy.max_concurrent_gpus == DEMO_MAX_CONCURRENT_GPUS
    grants = LedgerEntry.objects.filter(project__slug="demo", kind="grant")
    assert [g.amount for g in grants] == [DEMO_CREDITS_PER_PERIOD]


# --- supervisor -----------------------------------------------------------------------------------------


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_each_childs_output_is_prefixed_with_its_name():
    out = StringIO()
    supervisor = Supervisor(out=out)
    child = supervisor.start("echoer", _python("print('hello'); print('world')"))
    child.process.wait(timeout=10)
    child.reader.join(timeout=5)
    lines = out.getvalue().splitlines()
    assert [line.split("|", 1)[0].strip() for line in lines] == ["echoer", "echoer"]
    assert [line.split("|", 1)[1].strip() for line in lines] == ["hello", "world"]


def test_a_child_that_dies_is_named_and_the_others_are_stopped():
    supervisor = Supervisor(out=StringIO())
    sleeper = supervisor.start("sleeper", _python("import time; time.sleep(60)"))
    supervisor.start("crasher", _python("raise SystemExit(3)"))
    deadline = time.monotonic() + 10
    while (dead := supervisor.first_unexpected_exit()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dead is not None and dead.name == "crasher" and dead.process.returncode == 3
    supervisor.stop(grace_s=5)
    assert sleeper.process.returncode == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace():
    out = StringIO()
    supervisor = Supervisor(out=out)
    stubborn = supervisor.start(
        "stubborn",
        _python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "time.sleep(60)"),
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while "ready" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    supervisor.stop(grace_s=0.5)
    assert stubborn.process.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5
    assert "did not stop" in out.getvalue()


# --- the whole system -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _embedded_env(var_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG"}}
    env.update(CONTROLPLANE_VAR_DIR=str(var_dir), RUNSYSTEM_BIND=f"127.0.0.1:{port}", PYTHONUNBUFFERED="1")
    return env


def _runsystem(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), "runsystem", "--no-frontend", *args]


@pytest.fixture
def embedded_only():
    """These start the system on its embedded defaults: once, in the SQLite leg of the suite, is enough."""
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("runs the system on its embedded defaults; covered by the SQLite leg")


@pytest.mark.slow
def test_a_port_in_use_is_refused_before_anything_starts(embedded_only, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(_runsystem("--check", "--no-agents"), env=_embedded_env(tmp_path, port), cwd=ROOT,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode != 0
    assert f"127.0.0.1:{port} is already in use" in done.stderr


@pytest.mark.slow
def test_sigterm_stops_every_child_and_exits_cleanly(embedded_only, tmp_path):
    port = _free_port()
    proc = subprocess.Popen(_runsystem("--no-agents"), env=_embedded_env(tmp_path, port), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "agents up" in line:
                break
        assert any("login:    operator /" in line for line in seen), "".join(seen)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(seen) + rest
    assert re.search(r"^runsystem +\| stopped$", rest, re.MULTILINE), rest
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "the web server outlived runsystem"


@pytest.mark.slow
def test_check_brings_up_the_default_simulated_fleet(embedded_only, tmp_path):
    port = _free_port()
    try:
        done = subprocess.run(_runsystem("--check", "--check-timeout", "150"), env=_embedded_env(tmp_path, port),
                              cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"runsystem --check did not finish: {exc.stdout!s}{exc.stderr!s}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "check ok: 3 servers, 20 GPUs, simulated" in output
    for hostname in ("sim-h100-01", "sim-h100-02", "sim-a100-01"):
        assert f"{hostname}: ready" in output


@pytest.mark.slow
def test_a_child_that_dies_stops_the_system_with_a_nonzero_exit_naming_it(embedded_only, tmp_path):
    env = {**_embedded_env(tmp_path, _free_port()), "RUNSYSTEM_FLEET": "sim-bad-01=2xNO-SUCH-GPU"}
    done = subprocess.run(_runsystem("--no-worker"), env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    assert "sim-bad-01 exited unexpectedly with status" in output
    assert re.search(r"^runsystem +\| stopped$", output, re.MULTILINE), output[-4000:]
