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
from typing import Any

import pytest
from django.core.management.base import CommandError

from controlplane.system.management.commands.runsystem import FleetMember, parse_bind, parse_fleet, portal_is_stale
from controlplane.system.management.supervisor import Child, CrashLoop, RestartPolicy, Supervisor
from tests.runsystem_support import ROOT, alive, embedded_env, free_port, runsystem_argv

# --- parsing --------------------------------------------------------------------------------------------


def test_fleet_is_read_as_hosts_with_gpu_specs():
    assert parse_fleet("sim-h100-01=8xH100-80GB, sim-a100-01=4xA100-40GB,") == [
        FleetMember("sim-h100-01", 8, "H100-80GB"),
        FleetMember("sim-a100-01", 4, "A100-40GB"),
    ]


def test_a_fleet_entry_may_give_a_mig_layout_that_reaches_the_agent_spec():
    (member,) = parse_fleet("sim-mig-01=2xH100-80GB:mig=3g.40gb+2x2g.20gb")
    assert member == FleetMember("sim-mig-01", 2, "H100-80GB", ":mig=3g.40gb+2x2g.20gb")
    assert member.spec == "2xH100-80GB:mig=3g.40gb+2x2g.20gb"


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
    from controlplane.inventory.models import GpuModel
    from controlplane.system.management.demo import seed_demo

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
    # The restricted queue class "high" is granted to the demo project's quota policy.
    from controlplane.scheduling.models import PriorityClass

    assert list(PriorityClass.objects.get(name="high").allowed_policies.values_list("project__slug", flat=True)) == [
        "demo"
    ]
    assert users.count() == 2
    assert set(GpuModel.objects.values_list("name", "memory_mib")) == {
        ("H100-80GB", 81559),
        ("A100-40GB", 40960),
        ("A100-80GB", 81920),
        ("MI300X", 196592),
        ("MI250X", 65536),
    }
    # The generated passwords work, and the second run shows the same ones instead of resetting them.
    for login_first, login_second in zip(first.logins, second.logins, strict=True):
        assert login_first.password and login_first.password == login_second.password
        assert users.get(username=login_first.username).check_password(login_first.password)


def test_demo_password_from_the_environment_is_applied(db, var_dir, monkeypatch):
    from django.contrib.auth import get_user_model

    from controlplane.system.management.demo import seed_demo

    monkeypatch.setenv("DEMO_OPERATOR_PASSWORD", "correct horse battery")
    seed_demo()
    assert get_user_model().objects.get(username="operator").check_password("correct horse battery")


def test_demo_does_not_show_a_password_changed_since_it_was_set(db, var_dir, monkeypatch):
    from django.contrib.auth import get_user_model

    from controlplane.system.management.demo import seed_demo

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
    from controlplane.inventory.models import GpuModel
    from controlplane.system.management.demo import seed_demo

    seed_demo()
    GpuModel.objects.filter(name="H100-80GB").update(price_per_gpu_hour=Decimal("9.99"))
    seed_demo()
    assert GpuModel.objects.get(name="H100-80GB").price_per_gpu_hour == Decimal("9.99")


def test_demo_project_gets_a_quota_policy_and_credits_once(db, var_dir):
    from controlplane.ledger.models import LedgerEntry, QuotaPolicy
    from controlplane.system.management.demo import DEMO_CREDITS_PER_PERIOD, DEMO_MAX_CONCURRENT_GPUS, seed_demo

    seed_demo()
    seed_demo()
    policy = QuotaPolicy.objects.get(project__slug="demo")
    assert policy.max_concurrent_gpus == DEMO_MAX_CONCURRENT_GPUS
    grants = LedgerEntry.objects.filter(project__slug="demo", kind="grant")
    assert [g.amount for g in grants] == [DEMO_CREDITS_PER_PERIOD]


# --- supervisor ---------------------------------------------------------------------------------------


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _supervisor(**policy: Any) -> tuple[Supervisor, StringIO, FakeClock]:
    """A supervisor on a clock the test moves, with its jitter fixed so each delay is the nominal one."""
    out, clock = StringIO(), FakeClock()
    return Supervisor(out=out, policy=RestartPolicy(**policy), clock=clock, rng=lambda: 1.0), out, clock


def _died(child: Child) -> None:
    child.process.wait(timeout=10)
    child.reader.join(timeout=5)


def _runsystem_lines(out: StringIO) -> list[str]:
    return [line.split("|", 1)[1].strip() for line in out.getvalue().splitlines() if line.startswith("runsystem ")]


def test_each_childs_output_is_prefixed_with_its_name():
    out = StringIO()
    supervisor = Supervisor(out=out)
    child = supervisor.start("echoer", _python("print('hello'); print('world')"))
    _died(child)
    lines = [line for line in out.getvalue().splitlines() if not line.startswith("runsystem ")]
    assert [line.split("|", 1)[0].strip() for line in lines] == ["echoer", "echoer"]
    assert [line.split("|", 1)[1].strip() for line in lines] == ["hello", "world"]
    assert _runsystem_lines(out) == [f"echoer started (pid {child.process.pid})"]


def test_a_child_that_dies_is_restarted_after_a_backoff_that_doubles_up_to_its_cap():
    supervisor, out, clock = _supervisor(first_delay_s=1, max_delay_s=4, crash_loop_deaths=100)
    child = supervisor.start("crasher", _python("raise SystemExit(3)"))
    pids = [child.process.pid]
    for delay in (1.0, 2.0, 4.0, 4.0):
        _died(child)
        supervisor.poll()
        assert child.restart_at == clock.now + delay
        clock.now += delay - 0.01
        supervisor.poll()
        assert child.process.pid == pids[-1], "restarted before its backoff passed"
        clock.now += 0.01
        supervisor.poll()
        assert child.process.pid != pids[-1]
        pids.append(child.process.pid)
    assert child.restarts == 4
    lines = _runsystem_lines(out)
    assert "crasher died (exit status 3) after 0.0s; restarting it in 1.0s" in lines
    assert "crasher died (exit status 3) after 0.0s; restarting it in 4.0s" in lines
    assert f"crasher restarted (pid {pids[-1]}; restart 4)" in lines


def test_a_child_that_ran_a_while_before_it_died_is_restarted_quickly_again():
    supervisor, _, clock = _supervisor(first_delay_s=1, max_delay_s=30, healthy_after_s=30, crash_loop_deaths=100)
    child = supervisor.start("crasher", _python("raise SystemExit(3)"))
    for _ in range(3):  # 1, 2, 4
        _died(child)
        supervisor.poll()
        clock.now = child.restart_at or 0.0
        supervisor.poll()
    _died(child)
    clock.now += 30  # as if it had run for 30 s this time
    supervisor.poll()
    assert child.restart_at == clock.now + 1.0


def test_a_death_by_signal_is_logged_with_the_signals_name():
    supervisor, out, _ = _supervisor()
    child = supervisor.start("sleeper", _python("import time; time.sleep(60)"))
    os.kill(child.process.pid, signal.SIGKILL)
    _died(child)
    supervisor.poll()
    assert "sleeper died (killed by SIGKILL) after 0.0s; restarting it in 1.0s" in _runsystem_lines(out)
    supervisor.stop(grace_s=5)


def test_a_crash_loop_raises_naming_the_child_and_the_others_are_stopped():
    supervisor, _, clock = _supervisor(first_delay_s=1, crash_loop_deaths=3, crash_loop_window_s=60)
    sleeper = supervisor.start("sleeper", _python("import time; time.sleep(60)"))
    crasher = supervisor.start("crasher", _python("raise SystemExit(3)"))
    with pytest.raises(CrashLoop, match=r"^crasher died 3 times within 60s \(last: exit status 3\)$"):
        for _ in range(3):
            _died(crasher)
            supervisor.poll()
            clock.now = crasher.restart_at or 0.0
            supervisor.poll()
    assert sleeper.process.poll() is None, "a crash loop of one child is no reason to touch the others"
    supervisor.stop(grace_s=5)
    assert sleeper.process.returncode == -signal.SIGTERM


def test_deaths_further_apart_than_the_window_are_no_crash_loop():
    supervisor, _, clock = _supervisor(first_delay_s=1, crash_loop_deaths=3, crash_loop_window_s=60)
    child = supervisor.start("crasher", _python("raise SystemExit(3)"))
    for _ in range(6):
        _died(child)
        clock.now += 31  # two deaths fit in any 60 s, never three
        supervisor.poll()
        clock.now = child.restart_at or 0.0
        supervisor.poll()
    assert child.restarts == 6


def test_what_a_dead_child_started_is_killed_before_it_is_restarted():
    supervisor, out, _ = _supervisor()
    parent = supervisor.start(
        "parent",
        _python("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                "print(p.pid, flush=True)"),
    )  # fmt: skip
    parent.process.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not (found := re.search(r"^parent +\| (\d+)$", out.getvalue(), re.MULTILINE)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found, out.getvalue()
    orphan = int(found[1])
    assert alive(orphan), "the grandchild outlives its parent, as gunicorn's workers would"
    supervisor.poll()
    deadline = time.monotonic() + 10
    while alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(orphan)
    supervisor.stop(grace_s=5)


def test_each_restart_gets_a_fresh_environment_and_a_failure_to_make_one_is_not_a_death():
    supervisor, out, clock = _supervisor(first_delay_s=1, crash_loop_deaths=2, crash_loop_window_s=60)
    made: list[int] = []

    def restart_env() -> dict[str, str]:
        made.append(len(made))
        if len(made) == 1:
            raise RuntimeError("the database is down")
        return {**os.environ, "GENERATION": str(len(made))}

    code = "import os; print('generation', os.environ.get('GENERATION', 'first')); raise SystemExit(3)"
    child = supervisor.start("child", _python(code), env=dict(os.environ), restart_env=restart_env)
    _died(child)
    supervisor.poll()
    clock.now = child.restart_at or 0.0
    supervisor.poll()  # restart_env fails: tried again later, and it is no second death
    assert child.restarts == 0 and child.restart_at == clock.now + 2.0
    assert "child: cannot prepare its restart (the database is down); trying again in 2.0s" in _runsystem_lines(out)
    clock.now = child.restart_at
    supervisor.poll()
    _died(child)
    assert child.restarts == 1
    assert re.findall(r"^child +\| generation (\w+)$", out.getvalue(), re.MULTILINE) == ["first", "2"]


def test_a_stop_cancels_a_pending_restart():
    supervisor, _, clock = _supervisor(first_delay_s=1)
    child = supervisor.start("crasher", _python("raise SystemExit(3)"))
    _died(child)
    supervisor.poll()
    supervisor.stop(grace_s=5)
    clock.now += 60
    supervisor.poll()
    assert child.restarts == 0


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
        done = subprocess.run(runsystem_argv("--check", "--no-agents"), env=embedded_env(tmp_path, port), cwd=ROOT,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode != 0
    assert f"127.0.0.1:{port} is already in use" in done.stderr


@pytest.mark.slow
def test_sigterm_stops_every_child_and_exits_cleanly(embedded_only, tmp_path):
    port = free_port()
    proc = subprocess.Popen(runsystem_argv("--no-agents"), env=embedded_env(tmp_path, port), cwd=ROOT,
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
    port = free_port()
    try:
        done = subprocess.run(runsystem_argv("--check", "--check-timeout", "150"), env=embedded_env(tmp_path, port),
                              cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"runsystem --check did not finish: {exc.stdout!s}{exc.stderr!s}")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "check ok: 4 servers, 24 GPUs, simulated" in output
    for hostname in ("sim-h100-01", "sim-h100-02", "sim-a100-01", "sim-mi300x-01"):
        assert f"{hostname}: ready" in output


@pytest.mark.slow
def test_a_crash_looping_child_stops_the_system_with_a_nonzero_exit_naming_it(embedded_only, tmp_path):
    env = {**embedded_env(tmp_path, free_port()), "RUNSYSTEM_FLEET": "sim-bad-01=2xNO-SUCH-GPU"}
    done = subprocess.run(runsystem_argv("--no-worker"), env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    # Restarted with backoff first: one death is no reason to stop, five within a minute are.
    assert len(re.findall(r"^runsystem +\| sim-bad-01 restarted \(pid \d+; restart \d\)$", output, re.MULTILINE)) == 4
    assert re.search(r"sim-bad-01 died 5 times within 60s \(last: exit status \d+\); stopping everything", output)
    assert re.search(r"^runsystem +\| stopped$", output, re.MULTILINE), output[-4000:]


# --- compose.yaml ---------------------------------------------------------------------------------------


def test_every_long_running_compose_service_is_restarted_when_it_fails_and_the_one_shot_migrate_is_not():
    """runsystem's restart policy in production is Docker's: a dead web, worker, beat or agent comes back."""
    import yaml

    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert services["migrate"]["restart"] == "no", "a finished migration restarted would loop forever"
    for name, service in services.items():
        if name != "migrate":
            assert service.get("restart") in {"unless-stopped", "always", "on-failure"}, name
