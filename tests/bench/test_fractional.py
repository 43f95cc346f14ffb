"""bench/fractional.py runs end to end at a tiny size, so that it cannot rot unnoticed. Its figures are not
judged (benchmarks are not timed tests); what must hold whatever the figures is checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _bench_url(name: str) -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}/{name}"


def _row(out: str, placement: str) -> list[str]:
    line = next(line for line in out.splitlines() if re.match(rf"{placement}\s+[\d,]+\s+[\d,]+\s+[\d.]+\s", line))
    return line[len(placement) :].replace(",", "").replace("|", " ").split()


def test_the_fractional_bench_books_every_placement_through_the_service():
    import psycopg

    url = _bench_url(f"bench_fractional_smoke_{os.getpid()}")
    try:
        proc = subprocess.run(
            [sys.executable, "bench/fractional.py", "--servers", "2", "--requests", "40", "--database", url],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": url},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        admin = url.rsplit("/", 1)[0].replace("postgres://", "postgresql://", 1) + "/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "errors 0" in out, out
    packed, rounded, first_fit = (_row(out, p) for p in ("packed", "rounded up", "first-fit"))
    # GPU-h asked, accepted, ratio, slices, whole | held, used | ...: the same requests for every placement.
    assert packed[0] == rounded[0] == first_fit[0]
    # A slice holds its share of its GPU and nothing more; rounded up, a slice request holds whole GPUs.
    assert packed[1] == packed[5] and first_fit[1] == first_fit[5]
    assert float(rounded[5]) > float(rounded[1])
    booked = re.search(r"^packed\s+slice\s+(\d+)\s+(\d+)", out, re.M)
    assert booked is not None and int(booked.group(1)) > 0, out
