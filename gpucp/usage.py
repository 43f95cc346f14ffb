"""``gpucp usage``: a project's usage report beside its ledger balance."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from gpucp.client import path
from gpucp.output import emit_json, hours, table, when
from gpucp.state import State, default_project, pass_state


def _row(label: str, r: dict[str, Any]) -> list[object]:
    util = "-" if r["util_mean_percent"] is None else f"{r['util_mean_percent']:.1f}"
    cost = "-" if r["cost"] is None else f"{r['cost']} {r['currency']}".strip()
    return [
        label,
        hours(r["booked_gpu_hours"]),
        hours(r["used_gpu_hours"]),
        hours(r["idle_gpu_hours"]),
        util,
        f"{r['energy_kwh']:.3f}",
        r["credits"],
        cost,
    ]


@click.command()
@click.option("--project", "-p", help="The project's slug (default: your only project).")
@click.option("--period", default="month", show_default=True, metavar="day|week|month", help="The range reported.")
@click.option(
    "--date", "day", type=click.DateTime(formats=["%Y-%m-%d"]), help="A day in the period (default: today, UTC)."
)
@click.option(
    "--by", "group_by", default="user", show_default=True, metavar="user|gpu_model|day|reservation", help="One row per."
)
@pass_state
def usage(state: State, project: str | None, period: str, day: datetime | None, group_by: str) -> None:
    """Usage and balance of a project.

    Booked, used and idle GPU-hours, utilization, energy, credits and cost over a period, and the
    ledger's balance.
    """
    api = state.api()
    slug = default_project(api, project)
    params: dict[str, Any] = {"project": slug, "period": period, "group_by": group_by}
    if day is not None:
        params["date"] = day.date().isoformat()
    report = api.get(path("usage", "report", slash=False), params)
    balance = api.get(path("ledger", "balances", slug))
    if state.json:
        emit_json({"report": report, "balance": balance})
        return
    start, end = when(report["start"], utc=state.utc), when(report["end"], utc=state.utc)
    click.echo(f"Usage of {slug}, {start} to {end}, by {group_by}:")
    rows = [_row(r["label"], r) for r in report["rows"]]
    rows.append(_row("total", report["totals"]))
    headers = ["", "BOOKED GPU-H", "USED GPU-H", "IDLE GPU-H", "UTIL %", "ENERGY KWH", "CREDITS", "COST"]
    click.echo(table(headers, rows, right=[1, 2, 3, 4, 5, 6]))
    click.echo(f"Balance: {balance['balance']} credits ({balance['held']} held for booked windows).")
