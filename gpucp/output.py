"""Tables and times for people; JSON for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] = ()) -> str:
    """Aligned columns; the columns numbered in ``right`` (numbers) are aligned to the right."""
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def when(value: str | None, *, utc: bool, seconds: bool = False) -> str:
    """An API instant in the local zone (or UTC), with the zone named: ``2026-05-01 14:00 CEST``."""
    if not value:
        return "-"
    instant = parse_time(value)
    shown = instant.astimezone(UTC) if utc else instant.astimezone()
    return shown.strftime("%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z")


def spec_text(spec: dict[str, Any]) -> str:
    """What a reservation asked for: ``2 x H100-80GB``, ``1 whole server of A100-40GB``, ``4 x >=40960 MiB``."""
    what = spec.get("gpu_model") or f">={spec.get('min_memory_mib')} MiB"
    if spec.get("whole_servers"):
        n = spec["whole_servers"]
        return f"{n} whole server{'s' if n != 1 else ''} of {what}"
    return f"{spec.get('gpu_count')} x {what}"


def hours(value: float) -> str:
    return f"{value:.2f}"
