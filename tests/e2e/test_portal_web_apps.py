"""The web proxy's browser proof (docs/proxy.md): in headless Chromium, through the portal, against a real system
whose agents run Docker and their SSH gateways. The script is tests/e2e/webapps.e2e.mjs: book JupyterLab from the
booking form (the shipped template on the local image ``gpucp-jupyter:test``), Open JupyterLab signed in, run a
cell over the kernel's WebSocket, upload a file and download it back, 404 for someone outside the project, the web
terminal shows the reservation's GPUs, and releasing the reservation closes the kernel's socket and the terminal
(4410) and leaves the lab answering 410.

It needs a Docker engine and builds the lab image when it is missing (``scripts/build-test-image``); it runs once,
in the SQLite leg, as test_portal.py does (the ``running_system`` fixture).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.runtime.jupyterimage import DEFAULT_TAG, ensure_jupyter_image
from tests.e2e.portal_support import ARTIFACTS, run_script

SCRIPT = Path(__file__).with_name("webapps.e2e.mjs")

pytestmark = [pytest.mark.slow, pytest.mark.docker]


@pytest.fixture(scope="module")
def jupyter_image(docker_client: Any) -> str:
    """The lab image, made sure of before the system starts (its agents use Docker only if an engine answers)."""
    ensure_jupyter_image(docker_client)
    return DEFAULT_TAG


def test_tenant_opens_jupyterlab_and_a_terminal_from_the_portal(jupyter_image: str, running_system: str) -> None:
    run_script(SCRIPT, running_system, env={"JUPYTER_IMAGE": jupyter_image})
    for name in ("webapps-03-lab", "webapps-04-notebook", "webapps-07-terminal", "webapps-08-lab-gone"):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000, name
