"""The efficiency statement: how well a project used the GPUs it held in a UTC month, beside its previous
month and the fleet, and the operator's ranking of every project (docs/efficiency.md).

Everything comes from the hourly tables the usage report reads: telemetry rollups (``GpuUsageHour``: held
and idle seconds, utilization, energy) and usage slices (``UsageSlice``: the credits the ledger charged,
split by hour). A statement is a constant number of aggregate queries whatever the project's size: the
rollups grouped by (month, reservation, site), the slices by (month, reservation), the sites' PUE and price,
the reservations' names; the fleet's figures are two more.

* **Utilization** is time-weighted: the mean of the rollups' means, each weighted by its minutes with a reading.
* **Idle**: held seconds in minutes under ``ACCOUNTING_IDLE_UTIL_PERCENT``; **idle credits** give each
  reservation's credits in the month the share of its held time that was idle.
* **Under the line**: the share of held GPU-hours (with a utilization reading) whose hour's mean utilization
  was under ``ACCOUNTING_LOW_UTIL_PERCENT`` (70 %).
* **Energy**: the GPUs' energy; the facility's is each GPU's energy times its site's PUE, and costs the site's
  price per kWh (a server in no site: ``DEFAULT_PUE`` and no price).
* **Profiling readings** (DCGM's SM active, tensor pipe active and DRAM active, from the GPM API where the
  GPU has it): the held-time-weighted mean of the hours' means, over the hours that have a reading. They are
  the evidence of work that utilization is not (a busy loop reads 100 % utilization and little SM activity);
  where no hour has them the figures are null and ``profiling`` says "not measured", never a zero.
* **Waste**, by which reservations are ranked: idle credits, then idle GPU-hours.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Case, F, FloatField, IntegerField, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Coalesce

from controlplane.accounting.models import MONEY_PLACES, GpuUsageHour, UsageSlice
from controlplane.accounting.selectors import final_until, low_util_percent
from controlplane.accounting.timeutil import month_start, next_month
from controlplane.accounts.models import Project
from controlplane.inventory.models import DEFAULT_PUE, Site
from controlplane.reservations.models import Reservation

ZERO = Decimal("0")
CSV_COLUMNS = (
    "key",
    "label",
    "held_gpu_hours",
    "idle_gpu_hours",
    "idle_share",
    "util_mean_percent",
    "low_util_share",
    "energy_kwh",
    "facility_energy_kwh",
    "energy_cost",
    "energy_wh_per_gpu_hour",
    "credits",
    "idle_credits",
    "profiling",
    "profiled_gpu_hours",
    "sm_active_percent",
    "tensor_active_percent",
    "dram_active_percent",
)

# DCGM's profiling fields as the hourly rollups keep them (GpuUsageHour.<name>_mean, a ratio 0..1).
PROFILING = ("sm_active", "tensor_active", "dram_active")
MEASURED, PARTLY_MEASURED, NOT_MEASURED = "measured", "partly measured", "not measured"
PROFILING_STATES = (MEASURED, PARTLY_MEASURED, NOT_MEASURED)


def energy_currency() -> str:
    return str(getattr(settings, "ENERGY_CURRENCY", "USD"))


@dataclass
class Figures:
    """Sums over some held GPU-hours; the shares and means follow from them."""

    held_s: float = 0.0
    idle_s: float = 0.0
    util_weighted: float = 0.0
    util_minutes: int = 0
    low_s: float = 0.0  # held seconds in hours under the line
    rated_s: float = 0.0  # held seconds in hours with a utilization reading
    energy_wh: float = 0.0
    facility_wh: float = 0.0
    energy_cost: Decimal = ZERO
    credits: Decimal = ZERO
    idle_credits: Decimal = ZERO
    # Per profiling field: the sum of hourly means x held seconds, and the held seconds of hours with a mean.
    sm_active_w: float = 0.0
    sm_active_s: float = 0.0
    tensor_active_w: float = 0.0
    tensor_active_s: float = 0.0
    dram_active_w: float = 0.0
    dram_active_s: float = 0.0

    def add(self, other: Figures) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def profiling(self) -> str:
        """Whether the held time has profiling readings: SM activity is the field every GPM GPU gives."""
        if not self.sm_active_s:
            return NOT_MEASURED
        return MEASURED if self.sm_active_s >= self.held_s - 1e-6 else PARTLY_MEASURED

    def _prof_percent(self, name: str) -> float | None:
        held = getattr(self, f"{name}_s")
        return round(getattr(self, f"{name}_w") / held * 100, 2) if held else None

    def as_dict(self) -> dict[str, Any]:
        held_h = self.held_s / 3600
        return {
            "held_gpu_hours": round(held_h, 4),
            "idle_gpu_hours": round(self.idle_s / 3600, 4),
            "idle_share": round(self.idle_s / self.held_s, 4) if self.held_s else None,
            "util_mean_percent": round(self.util_weighted / self.util_minutes, 2) if self.util_minutes else None,
            "low_util_share": round(self.low_s / self.rated_s, 4) if self.rated_s else None,
            "energy_kwh": round(self.energy_wh / 1000, 4),
            "facility_energy_kwh": round(self.facility_wh / 1000, 4),
            "energy_cost": str(self.energy_cost.quantize(MONEY_PLACES)),
            "energy_currency": energy_currency(),
            "energy_wh_per_gpu_hour": round(self.energy_wh / held_h, 2) if held_h else None,
            "credits": str(self.credits.quantize(MONEY_PLACES)),
            "idle_credits": str(self.idle_credits.quantize(MONEY_PLACES)),
            "profiling": self.profiling(),
            "profiled_gpu_hours": round(self.sm_active_s / 3600, 4),
            **{f"{name}_percent": self._prof_percent(name) for name in PROFILING},
        }


def _site_rates(site_ids: set[int | None]) -> dict[int | None, tuple[Decimal, Decimal]]:
    """(PUE, price per kWh) per site id; None (a server in no rack or site): the default PUE and no price."""
    rates: dict[int | None, tuple[Decimal, Decimal]] = {None: (DEFAULT_PUE, ZERO)}
    ids = [s for s in site_ids if s is not None]
    if ids:
        for pk, pue, price in Site.objects.filter(pk__in=ids).values_list("pk", "pue", "electricity_price_per_kwh"):
            rates[pk] = (pue, price)
    return rates


def _rollup_groups(hours: QuerySet[GpuUsageHour], keys: list[str], start: datetime) -> QuerySet[Any]:
    low = low_util_percent()
    return (
        hours.annotate(
            month=Case(When(hour__gte=start, then=Value(1)), default=Value(0), output_field=IntegerField()),
            site=F("gpu__server__rack__site_id"),
        )
        .values(*keys, "reservation_id", "site")
        .annotate(
            held=Coalesce(Sum("held_s"), 0.0),
            idle=Coalesce(Sum("idle_s"), 0.0),
            util_w=Coalesce(Sum(F("util_mean") * F("util_minutes"), output_field=FloatField()), 0.0),
            util_min=Coalesce(Sum("util_minutes"), 0),
            low=Coalesce(Sum("held_s", filter=Q(util_mean__lt=low)), 0.0),
            rated=Coalesce(Sum("held_s", filter=Q(util_mean__isnull=False)), 0.0),
            energy=Coalesce(Sum("energy_wh"), 0.0),
            **{
                f"{name}_w": Coalesce(Sum(F(f"{name}_mean") * F("held_s"), output_field=FloatField()), 0.0)
                for name in PROFILING
            },
            **{
                f"{name}_s": Coalesce(Sum("held_s", filter=Q(**{f"{name}_mean__isnull": False})), 0.0)
                for name in PROFILING
            },
        )
        .order_by()
    )


def _credit_groups(slices: QuerySet[UsageSlice], keys: list[str], start: datetime) -> QuerySet[Any]:
    return (
        slices.annotate(month=Case(When(hour__gte=start, then=Value(1)), default=Value(0), output_field=IntegerField()))
        .values(*keys, "reservation_id")
        .annotate(credits=Sum("credits"))
        .order_by()
    )


def _by_reservation(
    rollups: list[dict[str, Any]], credits: list[dict[str, Any]], keys: list[str]
) -> dict[tuple[Any, ...], dict[int | None, Figures]]:
    """Figures per (group key, reservation): energy priced at its site's rates, credits split into idle."""
    rates = _site_rates({r["site"] for r in rollups})
    out: dict[tuple[Any, ...], dict[int | None, Figures]] = defaultdict(lambda: defaultdict(Figures))
    for r in rollups:
        pue, price = rates.get(r["site"], rates[None])
        facility_wh = r["energy"] * float(pue)
        f = out[tuple(r[k] for k in keys)][r["reservation_id"]]
        f.add(
            Figures(
                held_s=r["held"],
                idle_s=r["idle"],
                util_weighted=r["util_w"],
                util_minutes=r["util_min"],
                low_s=r["low"],
                rated_s=r["rated"],
                energy_wh=r["energy"],
                facility_wh=facility_wh,
                energy_cost=Decimal(str(facility_wh)) / 1000 * price,
                **{f"{name}_{part}": r[f"{name}_{part}"] for name in PROFILING for part in ("w", "s")},
            )
        )
    for c in credits:
        f = out[tuple(c[k] for k in keys)][c["reservation_id"]]
        f.credits += c["credits"] or ZERO
    for groups in out.values():
        for f in groups.values():
            if f.held_s and f.credits:
                f.idle_credits = f.credits * Decimal(str(min(1.0, f.idle_s / f.held_s)))
    return out


def _total(groups: dict[int | None, Figures]) -> Figures:
    total = Figures()
    for f in groups.values():
        total.add(f)
    return total


def _fleet(start: datetime, end: datetime) -> Figures:
    """Every project's held GPU-hours in the month (unheld GPUs are no one's waste)."""
    rollups = list(
        _rollup_groups(GpuUsageHour.objects.filter(project__isnull=False, hour__gte=start, hour__lt=end), [], start)
    )
    credits = list(_credit_groups(UsageSlice.objects.filter(hour__gte=start, hour__lt=end), [], start))
    return _total(_by_reservation(rollups, credits, []).get((), {}))


def _waste_key(item: tuple[Any, Figures]) -> tuple[Decimal, float]:
    return (-item[1].idle_credits, -item[1].idle_s)


def statement(*, project: Project, month: datetime) -> dict[str, Any]:
    """The efficiency statement of ``project`` for the UTC month holding ``month``."""
    start = month_start(month)
    end = next_month(start)
    previous = month_start(start - timedelta(days=1))
    rollups = list(
        _rollup_groups(GpuUsageHour.objects.filter(project=project, hour__gte=previous, hour__lt=end), ["month"], start)
    )
    credits = list(
        _credit_groups(UsageSlice.objects.filter(project=project, hour__gte=previous, hour__lt=end), ["month"], start)
    )
    figures = _by_reservation(rollups, credits, ["month"])
    this, before = figures.get((1,), {}), figures.get((0,), {})
    names = {
        r["pk"]: r
        for r in Reservation.objects.filter(pk__in=[k for k in this if k is not None]).values("pk", "public_id", "name")
    }
    ranked = []
    for pk, f in sorted(this.items(), key=_waste_key):
        info = names.get(pk) if pk is not None else None
        ranked.append(
            {
                "reservation": str(info["public_id"]) if info else None,
                "name": info["name"] if info else "",
                **f.as_dict(),
            }
        )
    watermark = final_until()
    return {
        "project": project.slug,
        "period": f"{start:%Y-%m}",
        "start": start,
        "end": end,
        "provisional": watermark is None or watermark < end,
        "low_util_percent": low_util_percent(),
        "totals": _total(this).as_dict(),
        "previous": {"period": f"{previous:%Y-%m}", **_total(before).as_dict()},
        "fleet": _fleet(start, end).as_dict(),
        "reservations": ranked,
    }


def ranking(*, month: datetime) -> dict[str, Any]:
    """Operators: every project with held GPU-hours in the month, ranked by waste (idle credits, then idle
    GPU-hours), beside the fleet's figures. Four queries whatever the number of projects."""
    start = month_start(month)
    end = next_month(start)
    rollups = list(
        _rollup_groups(
            GpuUsageHour.objects.filter(project__isnull=False, hour__gte=start, hour__lt=end), ["project_id"], start
        )
    )
    credits = list(_credit_groups(UsageSlice.objects.filter(hour__gte=start, hour__lt=end), ["project_id"], start))
    figures = _by_reservation(rollups, credits, ["project_id"])
    per_project = {key[0]: _total(groups) for key, groups in figures.items()}
    slugs = dict(Project.objects.filter(pk__in=list(per_project)).values_list("pk", "slug"))
    fleet = Figures()
    for f in per_project.values():
        fleet.add(f)
    rows = [
        {"rank": n, "project": slugs.get(pk, ""), **f.as_dict()}
        for n, (pk, f) in enumerate(sorted(per_project.items(), key=_waste_key), start=1)
    ]
    watermark = final_until()
    return {
        "period": f"{start:%Y-%m}",
        "start": start,
        "end": end,
        "provisional": watermark is None or watermark < end,
        "fleet": fleet.as_dict(),
        "projects": rows,
    }


def statement_csv(data: dict[str, Any]) -> str:
    """The ranked reservations, then the month's total, the previous month's and the fleet's, as CSV."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    lines: list[dict[str, Any]] = [
        {"key": r["reservation"] or "", "label": r["name"], **r} for r in data["reservations"]
    ]
    lines.append({"key": "total", "label": f"Total {data['period']}", **data["totals"]})
    lines.append({"key": "previous", "label": f"Previous month {data['previous']['period']}", **data["previous"]})
    lines.append({"key": "fleet", "label": f"Fleet {data['period']}", **data["fleet"]})
    for line in lines:
        writer.writerow(["" if line.get(c) is None else line.get(c) for c in CSV_COLUMNS])
    return out.getvalue()


def ranking_csv(data: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(("rank", "project", *CSV_COLUMNS[2:]))
    for row in [*data["projects"], {"rank": "", "project": "fleet", **data["fleet"]}]:
        writer.writerow(
            [row["rank"], row["project"], *("" if row.get(c) is None else row.get(c) for c in CSV_COLUMNS[2:])]
        )
    return out.getvalue()
