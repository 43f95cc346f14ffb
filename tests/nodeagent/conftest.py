"""Fixtures for the node agent's tests: a control plane double on a real socket and a clock tests move."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from control_plane_double import ControlPlaneDouble, FakeClock


@pytest.fixture
def control_plane() -> Iterator[ControlPlaneDouble]:
    double = ControlPlaneDouble()
    yield double
    double.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
