"""``python -m tests.faults.agent_process run ...``: the node agent's own ``main``, unchanged but for one thing: its
command listener is advertised at ``FAULTS_AGENT_FRONT_PORT`` (a TCP proxy of the test's in front of the real
listener), so the control plane's pushes cross the same partition as the agent's heartbeats; and, with
``FAULTS_AGENT_BACKOFF_CAP_S``, a shorter cap on the waits between its tries.

A process of its own, not a thread: the outage tests SIGKILL and SIGSTOP it."""

from __future__ import annotations

import os
import sys
from typing import Any

from nodeagent import client, commands
from nodeagent.__main__ import main


def _fronted_url(channel: commands.CommandChannel) -> str | None:
    real = _real_url.fget(channel)  # type: ignore[attr-defined]  # a property, which mypy types as its getter
    front = os.environ.get("FAULTS_AGENT_FRONT_PORT")
    if real is None or not front:
        return real
    return f"http://127.0.0.1:{int(front)}{commands.COMMAND_PATH}"


_real_url = commands.CommandChannel.url
commands.CommandChannel.url = property(_fronted_url)  # type: ignore[assignment,method-assign]
# Short waits between tries once the control plane is back (FAULTS_AGENT_BACKOFF_CAP_S, as the partition test's
# threaded agents have): the tests time the return in seconds, not in the default's minute.
_backoff_init = client.Backoff.__init__


def _capped_backoff(self: client.Backoff, *args: Any, **kwargs: Any) -> None:
    _backoff_init(self, *args, **kwargs)
    cap = float(os.environ["FAULTS_AGENT_BACKOFF_CAP_S"])
    self.base_s, self.cap_s = min(self.base_s, cap / 2), min(self.cap_s, cap)


if os.environ.get("FAULTS_AGENT_BACKOFF_CAP_S"):
    client.Backoff.__init__ = _capped_backoff  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
