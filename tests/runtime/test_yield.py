"""A window cut short (a preemption) on a real engine: the notice comes again, with its reason, before the
new end, then SIGTERM at the new end (docs/runtime.md, "The end of a window")."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from .support import T0, logs_of, ours, status_of, wait_for
from .test_stop import SIGNAL_RECORDER

pytestmark = pytest.mark.docker

REASON = "preempted by reservation 7a1c0b9e-0000-4000-8000-000000000001"


def warnings_in(container) -> list[dict]:  # type: ignore[no-untyped-def]
    return [json.loads(line.split(" ", 1)[1]) for line in logs_of(container).splitlines() if line.startswith("USR1")]


def test_a_window_shortened_after_its_warning_is_warned_again_then_stopped_at_the_new_end(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    end = T0 + timedelta(minutes=10)
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER], window_end=end, warn_before_s=300)
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")
    runtime.reconcile([spec], [], end - timedelta(seconds=300))
    wait_for(lambda: len(warnings_in(container)) == 1, what="the end-of-window warning")

    # Cut short: the new end is two minutes away, and the notice is the preemption's, 120 s.
    now = end - timedelta(seconds=280)
    new_end = now + timedelta(seconds=120)
    cut = spec.model_copy(update={"window_end": new_end, "warn_before_s": 120, "notice_reason": REASON})
    runtime.reconcile([cut], [], now)
    wait_for(lambda: len(warnings_in(container)) == 2, what="the preemption notice")
    notice = warnings_in(container)[1]
    assert notice["window_end"] == notice["stop_at"] == new_end.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert notice["reason"] == REASON
    # Once only, and no stop before the new end.
    runtime.reconcile([cut], [], new_end - timedelta(seconds=1))
    assert len(warnings_in(container)) == 2 and status_of(container) == "running"
    runtime.reconcile([cut], [], new_end)
    wait_for(lambda: status_of(container) == "exited", what="the stop at the new end")
    assert logs_of(container).splitlines()[-1] == "TERM"


def test_a_window_shortened_before_its_warning_is_warned_its_notice_before_the_new_end(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    end = T0 + timedelta(hours=3)
    spec = make_desired(command=["sh", "-c", SIGNAL_RECORDER], window_end=end, warn_before_s=300)
    runtime.reconcile([spec], [], T0)
    [container] = ours(docker_client, node)
    wait_for(lambda: "started" in logs_of(container), what="the job's traps")

    new_end = T0 + timedelta(minutes=10)
    cut = spec.model_copy(update={"window_end": new_end, "warn_before_s": 120, "notice_reason": REASON})
    runtime.reconcile([cut], [], new_end - timedelta(seconds=121))
    assert warnings_in(container) == []
    runtime.reconcile([cut], [], new_end - timedelta(seconds=120))
    wait_for(lambda: len(warnings_in(container)) == 1, what="the preemption notice")
    assert warnings_in(container)[0]["reason"] == REASON
