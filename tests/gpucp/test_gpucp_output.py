"""Tables and times for people."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpucp.output import spec_text, table, when


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_times_are_shown_in_the_local_zone_with_its_name(berlin: None):
    assert when("2026-07-01T12:00:00Z", utc=False) == "2026-07-01 14:00 CEST"
    assert when("2026-01-01T12:00:00.5+00:00", utc=False, seconds=True) == "2026-01-01 13:00:00 CET"


def test_utc_shows_utc(berlin: None):
    assert when("2026-07-01T14:00:00+02:00", utc=True) == "2026-07-01 12:00 UTC"


def test_no_time_is_a_dash():
    assert when(None, utc=True) == "-"


def test_columns_are_aligned_and_numbers_right_aligned():
    out = table(["NAME", "N"], [["a", 1], ["long-name", 120]], right=[1])
    assert out.splitlines() == ["NAME         N", "a            1", "long-name  120"]


def test_specs_read_as_people_say_them():
    assert spec_text({"gpu_model": "H100-80GB", "gpu_count": 2}) == "2 x H100-80GB"
    assert spec_text({"gpu_model": "A100-40GB", "whole_servers": 1}) == "1 whole server of A100-40GB"
    assert spec_text({"min_memory_mib": 40960, "gpu_count": 4}) == "4 x >=40960 MiB"
