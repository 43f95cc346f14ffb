from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.inventory.models import GpuModel, Server
from tests.factories import OperatorFactory
from tests.fleet.helpers import enroll, h100_model


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
