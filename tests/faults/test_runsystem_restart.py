"""A real ``runsystem`` whose children are killed with SIGKILL: each comes back, and nothing else moves.

One system serves the module (its start is most of the cost); each test kills one child and checks that the
others kept their pids, that the dead one was restarted under a new pid, and that the log names it with how it
died. It runs on the embedded defaults in a var dir of its own (SQLite, the filesystem broker), so it shares
neither the suite's database nor its Redis.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.runsystem_support import ROOT, RunningSystem, alive, embedded_env

pytestmark = pytest.mark.slow

FLEET = {"sim-h100-01": "2xH100-80GB", "sim-a100-01": "1xA100-40GB"}
CHILDREN = ["web", "proxy", "worker", "beat", *FLEET]
# The first restart waits 0.5-1 s (the backoff's jitter); the rest is a Python start-up.
RESTART_WITHIN_S = 30


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSystem]:
    running = RunningSystem(
        tmp_path_factory.mktemp("runsystem"),
        extra_env={"RUNSYSTEM_FLEET": ",".join(f"{host}={spec}" for host, spec in FLEET.items())},
    )
    try:
        running.wait_for(r"\d+ agents up", timeout=180)
        yield running
    finally:
        status = running.stop()
        assert not running.leftovers(), "runsystem left processes behind"
        assert status == 0, running.output[-4000:]


def current_pids(system: RunningSystem) -> dict[str, int]:
    """Each child's pid as runsystem last logged it."""
    pids = {}
    for line in system.output.splitlines():
        if match := re.match(r"^runsystem +\| (\S+) (?:re)?started \(pid (\d+)", line):
            pids[match[1]] = int(match[2])
    return pids


def kill_and_wait_for_restart(system: RunningSystem, child: str) -> tuple[int, int, float]:
    """SIGKILL ``child`` alone (not its group, as the OOM killer would); its old and new pid, and the seconds
    from the kill to the restart."""
    before = current_pids(system)
    assert set(before) == set(CHILDREN), before
    mark = system.mark()
    killed_at = time.monotonic()
    os.kill(before[child], signal.SIGKILL)
    system.wait_for(
        rf"^runsystem +\| {re.escape(child)} died \(killed by SIGKILL\) after [\d.]+s; restarting it in [\d.]+s$",
        after=mark,
        timeout=10,
    )
    new = system.pid_of(child, after=mark, timeout=RESTART_WITHIN_S)
    took = time.monotonic() - killed_at
    assert new != before[child] and alive(new)
    after = current_pids(system)
    for other in CHILDREN:
        if other != child:
            assert after[other] == before[other] and alive(before[other]), f"{other} was touched"
    assert system.process.poll() is None, "runsystem stopped"
    print(f"{child}: restarted {took:.1f}s after its SIGKILL")
    return before[child], new, took


def database(system: RunningSystem) -> sqlite3.Connection:
    path = Path(system.var_dir) / "controlplane.sqlite3"
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)


def test_a_killed_worker_is_restarted_and_the_others_keep_running(system: RunningSystem) -> None:
    kill_and_wait_for_restart(system, "worker")


def test_a_killed_beat_is_restarted_and_the_others_keep_running(system: RunningSystem) -> None:
    kill_and_wait_for_restart(system, "beat")


def test_a_killed_web_server_is_restarted_and_answers_again(system: RunningSystem) -> None:
    # gunicorn's workers outlive a SIGKILLed master and hold the port until they go too; the new master
    # must get it all the same.
    killed_at = time.monotonic()
    kill_and_wait_for_restart(system, "web")
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{system.port}/admin/login/", timeout=3) as response:
                assert response.status == 200
                break
        except OSError:
            if time.monotonic() > killed_at + 60:
                raise
            time.sleep(0.2)
    print(f"web: answered again {time.monotonic() - killed_at:.1f}s after its SIGKILL")
    assert "web died" not in system.output.split("web restarted")[-1], "the restarted web server died again"


def test_a_killed_web_proxy_is_restarted_and_answers_again(system: RunningSystem) -> None:
    [port] = set(re.findall(r"web proxy on 127\.0\.0\.1:(\d+)", system.output))
    killed_at = time.monotonic()
    kill_and_wait_for_restart(system, "proxy")
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_gpucp/healthz", timeout=3) as response:
                assert response.status == 200
                break
        except OSError:
            if time.monotonic() > killed_at + 60:
                raise
            time.sleep(0.2)
    print(f"proxy: answered again {time.monotonic() - killed_at:.1f}s after its SIGKILL")


def test_a_killed_agent_comes_back_with_its_saved_credential_and_reports_again(system: RunningSystem) -> None:
    host = "sim-a100-01"
    credential = (Path(system.var_dir) / "agents" / host / "credential").read_text()
    with database(system) as db:
        join_tokens = db.execute("SELECT count(*) FROM fleet_jointoken").fetchone()[0]
    killed_at, killed_mono = datetime.now(UTC).replace(tzinfo=None), time.monotonic()
    kill_and_wait_for_restart(system, host)

    # It reports again: a heartbeat after the kill can only come from the restarted agent.
    deadline = time.monotonic() + 60
    while True:
        with database(system) as db:
            (last,) = db.execute("SELECT last_heartbeat_at FROM inventory_server WHERE hostname = ?", [host]).fetchone()
        if last and datetime.fromisoformat(last).replace(tzinfo=None) > killed_at:
            break
        assert time.monotonic() < deadline, f"{host} has not reported since its restart (last heartbeat {last})"
        time.sleep(0.2)
    print(f"{host}: reported again {time.monotonic() - killed_mono:.1f}s after its SIGKILL")
    # ... with the credential it had, and no join token was needed for it.
    assert (Path(system.var_dir) / "agents" / host / "credential").read_text() == credential
    with database(system) as db:
        assert db.execute("SELECT count(*) FROM fleet_jointoken").fetchone()[0] == join_tokens
        active = db.execute(
            "SELECT count(*) FROM fleet_nodecredential c JOIN inventory_server s ON s.id = c.server_id "
            "WHERE s.hostname = ? AND c.revoked_at IS NULL",
            [host],
        ).fetchone()[0]
    assert active == 1
    assert f"{host}: its stored credential is unknown here" not in system.output
    assert f"{host}: its agent lost its credential" not in system.output


def test_an_agent_whose_credential_is_revoked_is_restarted_with_a_new_join_token(system: RunningSystem) -> None:
    # The agent stops on a refused credential (an operator cut the node off); its restart must enroll it
    # again rather than fail the same way five times and take the system down.
    host = "sim-h100-01"
    state = Path(system.var_dir) / "agents" / host
    credential = (state / "credential").read_text()
    with database(system) as db:
        join_tokens = db.execute("SELECT count(*) FROM fleet_jointoken").fetchone()[0]
    mark = system.mark()
    revoke = (
        "from controlplane.system.management.demo import operator_user\n"
        "from controlplane.fleet.services import credential_revoke\n"
        "from controlplane.inventory.models import Server\n"
        f"credential_revoke(server=Server.objects.get(hostname={host!r}), actor=operator_user(), reason='test')\n"
    )
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", revoke],
        env=embedded_env(system.var_dir, system.port),
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    system.wait_for(rf"^runsystem +\| {host} died \(exit status \d+\)", after=mark, timeout=60)
    system.pid_of(host, after=mark, timeout=RESTART_WITHIN_S)
    system.wait_for(rf"^{host} +\| .*enrolled as server", after=mark, timeout=60)
    assert (state / "credential").read_text() != credential
    assert (state / "credential.revoked").read_text() == credential
    with database(system) as db:
        assert db.execute("SELECT count(*) FROM fleet_jointoken").fetchone()[0] == join_tokens + 1
    assert system.process.poll() is None
