from __future__ import annotations

from typing import Any

import pytest

from tests.reservations.fleet import gpu_model, project, server


@pytest.fixture
def model(db: Any) -> Any:
    return gpu_model("H100-80GB", weight="2")


@pytest.fixture
def rack(model: Any) -> Any:
    return server(model, gpus=4)


@pytest.fixture
def proj(db: Any) -> Any:
    return project()
