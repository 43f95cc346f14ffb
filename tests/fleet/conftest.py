from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.inventory.models import GpuModel, Server
from tests.factories import OperatorFactory
from tests.fleet.helpers import enroll, h100_model


@pytest.fixture(autouse=True, params=[1, 2], ids=["wire-v1", "wire-v2"])
def wire_version(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Every fleet test runs with heartbeats of both wire versions: the agent sends 2, older agents 1."""
    from tests.fleet import helpers

    monkeypatch.setattr(helpers, "WIRE_VERSION", request.param)
    return int(request.param)


@pytest.fixture
def operator(db: Any) -> Any:
    return OperatorFactory(username="opal")


@pytest.fixture
def h100(db: Any) -> GpuModel:
    return h100_model()


@pytest.fixture
def node(db: Any, h100: GpuModel) -> tuple[Server, str]:
    """An enrolled server ``node-a`` and its node credential."""
    return enroll("node-a")


@pytest.fixture
def agent(node: tuple[Server, str]) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {node[1]}")
    return client
