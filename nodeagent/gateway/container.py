"""The one container a session may reach, found through Docker's labels, and small commands run inside it.

Everything here is blocking Docker Engine API calls; the gateway runs them in its executor, never on its
event loop. Nothing here starts a process on the host: a command always runs through the Engine API's exec,
inside the container.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from docker.errors import DockerException
from requests.exceptions import RequestException

from nodeagent.runtime.containers import LABEL_LAUNCH, LABEL_NODE

# The errors a call to the engine ends in when the engine or the container is not there.
ENGINE_ERRORS = (DockerException, RequestException, OSError)
EXIT_WAIT_S = 5.0


@dataclass(frozen=True)
class Target:
    """A running container of one launch: its id, its init's host pid (for its network namespace) and the
    directory sessions start in."""

    container_id: str
    pid: int
    working_dir: str


def find_running(api: Any, *, node: str, launch_id: str) -> Target | None:
    """The running container of ``launch_id`` on this node, or None. ``api`` is ``docker.APIClient``."""
    found = api.containers(filters={"label": [f"{LABEL_LAUNCH}={launch_id}", f"{LABEL_NODE}={node}"]})
    for summary in found:
        info = api.inspect_container(summary["Id"])
        labels = info.get("Config", {}).get("Labels") or {}
        state = info.get("State") or {}
        # Checked again on the answer: the filter is the engine's, the decision is ours.
        if labels.get(LABEL_LAUNCH) != launch_id or labels.get(LABEL_NODE) != node:
            continue
        if state.get("Status") != "running" or not state.get("Pid"):
            continue
        return Target(
            container_id=str(info["Id"]),
            pid=int(state["Pid"]),
            working_dir=str(info.get("Config", {}).get("WorkingDir") or "/"),
        )
    return None


@dataclass(frozen=True)
class Result:
    code: int
    stdout: bytes
    stderr: bytes


def exit_code(api: Any, exec_id: str, *, wait_s: float = EXIT_WAIT_S) -> int:
    """The exit status of a finished exec; the engine may say "running" for a moment after its output ends."""
    deadline = time.monotonic() + wait_s
    while True:
        info = api.exec_inspect(exec_id)
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        if time.monotonic() > deadline:
            return 255
        time.sleep(0.02)


def capture(api: Any, container_id: str, argv: list[str]) -> Result:
    """Run ``argv`` in the container (no stdin, no TTY) and collect what it wrote."""
    created = api.exec_create(container_id, argv, stdin=False, stdout=True, stderr=True, tty=False)
    out, err = api.exec_start(created["Id"], demux=True)
    return Result(code=exit_code(api, created["Id"]), stdout=out or b"", stderr=err or b"")
