"""Two beats: every periodic task is documented with how it stays correct when two beats send it, the
documented leases are the ones the tasks take, and compose.yaml runs two of everything."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from celery import current_app
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent.parent


def table() -> dict[str, str]:
    """The "Periodic work with two beats" table of docs/operations.md: beat entry -> how it stays correct."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("### Periodic work with two beats", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if match := re.match(r"^\| `([a-z0-9-]+)` \(`([a-z_.]+)`\) \| [^|]+ \| (.+) \|$", line):
            entry, task, how = match.groups()
            rows[entry] = f"{task}|{how}"
    return rows


def test_every_beat_entry_is_in_the_table_with_its_task():
    rows = table()
    assert set(rows) == set(settings.CELERY_BEAT_SCHEDULE)
    for entry, spec in settings.CELERY_BEAT_SCHEDULE.items():
        task = str(spec["task"]).removeprefix("controlplane.")
        assert rows[entry].split("|", 1)[0] == task, entry


def test_the_tasks_the_table_puts_behind_the_lease_take_it_and_the_others_do_not():
    current_app.loader.import_default_modules()
    for entry, spec in settings.CELERY_BEAT_SCHEDULE.items():
        task = current_app.tasks[str(spec["task"])]
        documented = table()[entry].split("|", 1)[1].startswith("**leader lease**")
        assert (getattr(task.run, "leader_lease", None) is not None) == documented, entry
        assert documented or table()[entry].split("|", 1)[1].startswith("idempotent"), entry


def test_compose_runs_two_webs_workers_and_beats_each_beat_with_a_schedule_file_of_its_own():
    compose = (ROOT / "compose.yaml").read_text()
    services = yaml.safe_load(compose)["services"]
    for name in ("web", "worker", "beat"):
        replicas = services[name]["deploy"]["replicas"]
        assert re.fullmatch(r"\$\{[A-Z_]+:-2\}", str(replicas)), (name, replicas)
    beat = services["beat"]["command"]
    schedule = beat[beat.index("--schedule") + 1]
    shared = [volume.split(":", 1)[1] for volume in services["beat"]["volumes"]]
    assert not any(schedule.startswith(path) for path in shared), "two beats must not share one schedule file"
    # The agents and users reach the webs through the balancer.
    assert services["agent"]["environment"]["NODEAGENT_SERVER"] == "http://lb:8000"
    assert "server web:8000 resolve" in yaml.safe_load(compose)["configs"]["lb-conf"]["content"]
