"""A live control plane for the CLI tests, and ``gpucp`` run in-process against it.

The server is pytest-django's ``live_server``: the real Django stack over HTTP, nothing of the API faked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from gpucp_support import Gpucp, World, invoke, token_of

from tests.factories import UserFactory
from tests.reservations.fleet import gpu_model, project, server


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config directory of the test's own; nothing from the developer's environment leaks in."""
    home = tmp_path / "xdg-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.delenv("GPUCP_SERVER", raising=False)
    monkeypatch.delenv("GPUCP_TOKEN", raising=False)
    return home


@pytest.fixture
def world(transactional_db: None, live_server: Any, config_home: Path) -> World:
    """One 8 x H100 server, ``alice`` owning project ``demo`` with 1000 credits, and a token of hers."""
    model = gpu_model()
    srv = server(model, gpus=8, hostname="gpu-h100-01")
    owner = UserFactory(username="alice")
    proj = project(owner=owner, grant="1000", slug="demo")
    return World(url=live_server.url, owner=owner, project=proj, token=token_of(owner)[1],
                 model=model, server=srv)  # fmt: skip


@pytest.fixture
def gpucp(world: World) -> Gpucp:
    """``gpucp(*args)``: the CLI with alice's token and the live server in the environment (GPUCP_*)."""

    def run(
        *args: str, token: str | None = world.token, server: str | None = world.url, input: str | None = None
    ) -> Result:
        return invoke(list(args), env={"GPUCP_SERVER": server, "GPUCP_TOKEN": token}, input=input)

    return run
