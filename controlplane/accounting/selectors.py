"""Reports: a few aggregate queries over the hourly tables, merged in Python.

Booked and used GPU-hours, credits and cost come from usage slices (settled reservations); idle GPU-hours,
utilization and energy from the hourly telemetry rollups. Both tables have a covering index on (project, hour)
holding the columns summed here, so a project's report is two index-only range scans with a GROUP BY each,
whatever the size of the fleet.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Exists, F, FloatField, IntegerField, OuterRef, QuerySet, Sum, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, TruncDay, TruncHour
from django.utils import timezone

from controlplane.accounting.choices import Bucket, FleetGroupBy, GroupBy
from controlplane.accounting.models import (
    MONEY_PLACES,
    GpuUsageHour,
    MonthlyStatement,
    RollupWatermark,
    UsageRecord,
    UsageSlice,
)
from controlplane.accounting.rollup import WATERMARK
from controlplane.accounting.services import allocation_held, launch_intervals
from controlplane.accounting.timeutil import split_by_hour
from controlplane.accounts.models import Project
from controlplane.accounts.selectors import projects_visible_to
from controlplane.inventory.models import GpuModel, price_for_weight
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.ledger.services import STORAGE_DATA_KIND, hour_key_for
from controlplane.reservations import costs
from controlplane.reservations.models import Allocation, Reservation

ZERO = Decimal("0")
SECONDS_PER_HOUR = 3600.0
HOURS_PLACES = 6

# Columns of a report row, in CSV order.
COLUMNS = (
    "key",
    "label",
    "booked_gpu_hours",
    "used_gpu_hours",
    "held_gpu_hours",
    "idle_gpu_hours",
    "util_mean_percent",
    "low_utilization",
    "energy_kwh",
    "credits",
    "cost",
    "currency",
    "unit",
)


def low_util_percent() -> float:
    return float(getattr(settings, "ACCOUNTING_LOW_UTIL_PERCENT", 70.0))


@dataclass
class ReportRow:
    key: str
    label: str
    booked_s: float = 0.0
    used_s: float = 0.0
    held_s: float = 0.0
    idle_s: float = 0.0
    util_weighted: float = 0.0
    util_minutes: int = 0
    energy_wh: float = 0.0
    credits: Decimal = ZERO
    costs: dict[str, Decimal] = field(default_factory=dict)
    # Grouped by GPU model: "gpu" for whole GPUs, the MIG profile ("1g.10gb") for slices; "" otherwise.
    unit: str = ""
    # Still settling: a reservation not yet settled (figures so far, credits estimated) or an hour the
    # telemetry rollup has not finished (utilization, idle time and energy may still change).
    provisional: bool = False

    def add(self, other: ReportRow) -> None:
        self.provisional = self.provisional or other.provisional
        self.booked_s += other.booked_s
        self.used_s += other.used_s
        self.held_s += other.held_s
        self.idle_s += other.idle_s
        self.util_weighted += other.util_weighted
        self.util_minutes += other.util_minutes
        self.energy_wh += other.energy_wh
        self.credits += other.credits
        for currency, amount in other.costs.items():
            self.costs[currency] = self.costs.get(currency, ZERO) + amount

    @property
    def util_mean(self) -> float | None:
        return round(self.util_weighted / self.util_minutes, 2) if self.util_minutes else None

    def as_dict(self) -> dict[str, Any]:
        util = self.util_mean
        currencies = sorted(self.costs)
        return {
            "key": self.key,
            "label": self.label,
            "booked_gpu_hours": round(self.booked_s / SECONDS_PER_HOUR, HOURS_PLACES),
            "used_gpu_hours": round(self.used_s / SECONDS_PER_HOUR, HOURS_PLACES),
            "idle_gpu_hours": round(self.idle_s / SECONDS_PER_HOUR, HOURS_PLACES),
            "held_gpu_hours": round(self.held_s / SECONDS_PER_HOUR, HOURS_PLACES),
            "util_mean_percent": util,
            "low_utilization": util is not None and util < low_util_percent(),
            "energy_kwh": round(self.energy_wh / 1000.0, 6),
            "credits": self.credits,
            "cost": self.costs[currencies[0]] if len(currencies) == 1 else (ZERO if not currencies else None),
            "currency": currencies[0] if len(currencies) == 1 else ("" if not currencies else "mixed"),
            "costs": {c: self.costs[c] for c in currencies},
            "provisional": self.provisional,
            "unit": self.unit,
        }


@dataclass
class StorageLine:
    """Volumes' storage charged for the hours of a range (docs/volumes.md, "Charges"): GiB-hours of size
    limit, the credits the ledger took, what it could not take (credits ran out), per volume when asked."""

    gib_hours: int = 0
    credits: Decimal = ZERO
    uncharged: Decimal = ZERO
    volumes: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": "storage",
            "label": "Storage (volumes)",
            "gib_hours": self.gib_hours,
            "credits": self.credits.quantize(Decimal("0.0001")),
            "uncharged": self.uncharged.quantize(Decimal("0.0001")),
            "volumes": self.volumes,
        }


@dataclass
class Report:
    start: datetime
    end: datetime
    group_by: str
    project: Project | None
    rows: list[ReportRow]
    total: ReportRow
    storage: StorageLine = field(default_factory=StorageLine)
    final_until: datetime | None = None
    # Idle reclamation (docs/efficiency.md): GPU-hours released unkept after an idle warning, per project slug.
    reclaimed: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "project": self.project.slug if self.project else None,
            "provisional": self.total.provisional,
            "final_until": self.final_until,
            "start": self.start,
            "end": self.end,
            "group_by": self.group_by,
            "rows": [row.as_dict() for row in self.rows],
            "totals": self.total.as_dict(),
            "storage": self.storage.as_dict(),
            # GPU credits (totals.credits) and storage credits together: what the range cost the project.
            "total_credits": (self.total.credits + self.storage.credits).quantize(Decimal("0.0001")),
            "reclaimed_gpu_hours": round(sum(self.reclaimed.values()), 4),
            "reclaimed_by_project": {slug: round(hours, 4) for slug, hours in sorted(self.reclaimed.items())},
        }


def storage_charges(*, start: datetime, end: datetime, project: Project | None = None) -> StorageLine:
    """The storage charges of the hours in [start, end) (by the hour each pays for, not when it was written);
    a project's split by volume. Two grouped queries on the ledger's (project, kind) index."""
    qs = LedgerEntry.objects.filter(
        kind=EntryKind.CHARGE,
        reservation__isnull=True,
        period_key__gte=hour_key_for(start),
        period_key__lt=hour_key_for(end),
        data__kind=STORAGE_DATA_KIND,
    )
    if project is not None:
        qs = qs.filter(project=project)
    line = StorageLine()
    grouped = (
        qs.annotate(volume=KT("data__volume"))
        .values(*(["volume"] if project is not None else []))
        .order_by()
        .annotate(gib=Sum(Cast(KT("data__gib"), IntegerField())), amount=Sum("amount"))
    )
    for row in grouped:
        gib, charged = int(row["gib"] or 0), -(row["amount"] or ZERO)
        line.gib_hours += gib
        line.credits += charged
        if project is not None:
            line.volumes.append(
                {"volume": row["volume"], "gib_hours": gib, "credits": charged.quantize(Decimal("0.0001"))}
            )
    # Shortfalls are rare (credits ran out): read those entries alone.
    for data in qs.filter(data__has_key="uncharged").values_list("data", flat=True):
        line.uncharged += Decimal(str(data["uncharged"]))
    line.volumes.sort(key=lambda v: str(v["volume"]))
    return line


def _group_expr(group_by: str) -> Any:
    if group_by in (GroupBy.DAY, FleetGroupBy.DAY, Bucket.DAY):
        return TruncDay("hour")
    if group_by == Bucket.HOUR:
        return TruncHour("hour")
    columns: dict[str, str] = {
        GroupBy.USER: "user_id",
        GroupBy.GPU_MODEL: "gpu_model_id",
        GroupBy.RESERVATION: "reservation_id",
        FleetGroupBy.PROJECT: "project_id",
    }
    return F(columns[group_by])


# Grouped by GPU model, slices are rows of their own beside their model's whole GPUs: the group is the pair
# (GPU model, the reservation's MIG profile, "" for a whole-GPU booking). A reservation books one profile.
WHOLE_GPU = "gpu"


def _unit_split(group_by: str) -> bool:
    return group_by == GroupBy.GPU_MODEL


def _unit_expr() -> Any:
    return Coalesce(F("reservation__mig_profile"), Value(""))


def _labels(group_by: str, keys: set[Any]) -> dict[Any, tuple[str, str]]:
    """(key, label) per group value, with one small query for names."""
    if _unit_split(group_by):
        names = dict(GpuModel.objects.filter(pk__in={k[0] for k in keys}).values_list("pk", "name"))
        out: dict[Any, tuple[str, str]] = {}
        for model_id, unit in keys:
            name = " ".join(filter(None, (names.get(model_id, str(model_id)), unit)))
            out[(model_id, unit)] = (name, name)
        return out
    ids = [k for k in keys if k is not None]
    if group_by in (GroupBy.DAY, Bucket.DAY):
        return {k: (k.date().isoformat(), k.date().isoformat()) for k in ids}
    if group_by == Bucket.HOUR:
        return {k: (k.isoformat(), k.isoformat()) for k in ids}
    if group_by == GroupBy.USER:
        names = dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
        out = {k: (names.get(k, str(k)), names.get(k, str(k))) for k in ids}
        out[None] = ("", "(no user)")
        return out
    if group_by == GroupBy.GPU_MODEL:
        names = dict(GpuModel.objects.filter(pk__in=ids).values_list("pk", "name"))
        return {k: (names.get(k, str(k)), names.get(k, str(k))) for k in ids}
    if group_by == GroupBy.RESERVATION:
        rows = Reservation.objects.filter(pk__in=ids).values_list("pk", "public_id", "name")
        return {pk: (str(public_id), name) for pk, public_id, name in rows}
    projects = Project.objects.filter(pk__in=ids).values_list("pk", "slug", "name")
    out = {pk: (slug, name) for pk, slug, name in projects}
    out[None] = ("", "(not held)")
    return out


def _aggregate(*, slices: QuerySet[UsageSlice], hours: QuerySet[GpuUsageHour], group_by: str) -> dict[Any, ReportRow]:
    group = _group_expr(group_by)
    split = _unit_split(group_by)
    # The unit (and its join to the reservation) only where the grouping splits by it.
    units = {"u": _unit_expr()} if split else {}
    rows: dict[Any, ReportRow] = defaultdict(lambda: ReportRow(key="", label=""))
    for r in (
        slices.annotate(g=group, **units)
        .values("g", *units, "currency")
        .order_by()
        .annotate(booked=Sum("booked_s"), used=Sum("used_s"), credits=Sum("credits"), cost=Sum("cost"))
    ):
        row = rows[(r["g"], r["u"]) if split else r["g"]]
        row.booked_s += r["booked"] or 0.0
        row.used_s += r["used"] or 0.0
        row.credits += r["credits"] or ZERO
        row.costs[r["currency"]] = row.costs.get(r["currency"], ZERO) + (r["cost"] or ZERO)
    for h in (
        hours.annotate(g=group, **units)
        .values("g", *units)
        .order_by()
        .annotate(
            held=Sum("held_s"),
            idle=Sum("idle_s"),
            energy=Sum("energy_wh"),
            umin=Sum("util_minutes"),
            uweighted=Sum(F("util_mean") * Cast("util_minutes", FloatField())),
        )
    ):
        row = rows[(h["g"], h["u"]) if split else h["g"]]
        row.held_s += h["held"] or 0.0
        row.idle_s += h["idle"] or 0.0
        row.energy_wh += h["energy"] or 0.0
        row.util_minutes += h["umin"] or 0
        row.util_weighted += h["uweighted"] or 0.0
    return rows


def _finish(rows: dict[Any, ReportRow], group_by: str) -> tuple[list[ReportRow], ReportRow]:
    labels = _labels(group_by, set(rows))
    total = ReportRow(key="total", label="Total")
    out = []
    for value, row in rows.items():
        row.credits = row.credits.quantize(Decimal("0.0001"))
        row.costs = {c: a.quantize(Decimal("0.0001")) for c, a in row.costs.items()}
        row.key, row.label = labels.get(value, (str(value), str(value)))
        if _unit_split(group_by):
            row.unit = value[1] or WHOLE_GPU
        total.add(row)
        out.append(row)
    out.sort(key=lambda r: (r.key == "", r.key))
    return out, total


def final_until() -> datetime | None:
    """Where the telemetry rollup's final hours end: an hour starting at or after it is still redone on every
    run (its utilization, idle time and energy may change); None before the first rollup."""
    return RollupWatermark.objects.filter(name=WATERMARK).values_list("position", flat=True).first()


@dataclass(frozen=True)
class UnsettledPart:
    """One GPU-hour of a reservation that has no usage records yet: what it booked and ran so far."""

    hour: datetime
    project_id: int
    reservation_id: int
    user_id: int | None
    gpu_model_id: int
    unit: str  # the reservation's MIG profile, "" for whole GPUs
    booked_s: float
    used_s: float
    credits: Decimal
    cost: Decimal
    currency: str


def unsettled_parts(
    *, start: datetime, end: datetime, now: datetime, project: Project | None = None
) -> list[UnsettledPart]:
    """Reservations that held GPUs in [start, end) and are not recorded yet (running, or final and waiting for
    the recorder): booked time up to ``now`` and the container's run time the agent reported, per GPU and hour,
    and what that use is worth at the GPU model's billing weight and price. Provisional: the ledger's charge at
    settlement is the final word, and the usage records written then replace these figures."""
    upto = min(end, now)
    if upto <= start:
        return []
    recorded = UsageRecord.objects.filter(reservation=OuterRef("reservation_id"))
    allocations = (
        Allocation.objects.filter(starts_at__lt=upto, ends_at__gt=start)
        .filter(~Exists(recorded))
        .select_related("reservation", "gpu__model", "mig_device")
        .order_by("reservation_id", "gpu_id", "slice_start")
    )
    if project is not None:
        allocations = allocations.filter(reservation__project=project)
    found = list(allocations)
    costs.load_weights(found)
    by_reservation: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in found:
        by_reservation[allocation.reservation_id].append(allocation)
    parts: list[UnsettledPart] = []
    for held_gpus in by_reservation.values():
        reservation = held_gpus[0].reservation
        ran = launch_intervals(reservation=reservation, until=now)
        for allocation in held_gpus:
            held = allocation_held(allocation)
            if held is None:
                continue
            lo, hi = max(held[0], start), min(held[1], upto)
            if hi <= lo:
                continue
            booked = dict(split_by_hour(lo, hi))
            used: dict[datetime, float] = defaultdict(float)
            for a, b in ran.get(allocation.device_uuid, []):
                a, b = max(a, lo), min(b, hi)
                for hour, seconds in split_by_hour(a, b) if b > a else ():
                    used[hour] += seconds
            model = allocation.gpu.model
            # A MIG slice is worth its weight (reservations.costs.weight), in credits and, scaled alike, in price.
            weight = costs.weight(allocation)
            price = price_for_weight(model, weight, allocation.slice_end - allocation.slice_start)
            for hour in sorted(set(booked) | set(used)):
                used_s = used.get(hour, 0.0)
                gpu_hours = Decimal(repr(used_s)) / Decimal(3600)
                parts.append(
                    UnsettledPart(
                        hour=hour,
                        project_id=reservation.project_id,
                        reservation_id=reservation.pk,
                        user_id=reservation.created_by_id,
                        gpu_model_id=model.pk,
                        unit=reservation.mig_profile,
                        booked_s=booked.get(hour, 0.0),
                        used_s=used_s,
                        credits=(weight * gpu_hours).quantize(MONEY_PLACES),
                        cost=(price * gpu_hours).quantize(MONEY_PLACES),
                        currency=model.currency,
                    )
                )
    return parts


def _part_key(part: UnsettledPart, group_by: str) -> Any:
    """The group of an unsettled part, as ``_group_expr`` gives it for a stored row."""
    if group_by in (GroupBy.DAY, FleetGroupBy.DAY, Bucket.DAY):
        return part.hour.replace(hour=0)
    if group_by == Bucket.HOUR:
        return part.hour
    if _unit_split(group_by):
        return (part.gpu_model_id, part.unit)
    keys: dict[str, int | None] = {
        GroupBy.USER: part.user_id,
        GroupBy.GPU_MODEL: part.gpu_model_id,
        GroupBy.RESERVATION: part.reservation_id,
        FleetGroupBy.PROJECT: part.project_id,
    }
    return keys[group_by]


def _settling(
    rows: dict[Any, ReportRow],
    *,
    hours: QuerySet[GpuUsageHour],
    parts: list[UnsettledPart],
    group_by: str,
    mark: datetime | None,
) -> None:
    """Add the unsettled reservations' figures so far, and mark provisional every group that has them or an
    hour the rollup has not finished."""
    for part in parts:
        row = rows[_part_key(part, group_by)]
        row.booked_s += part.booked_s
        row.used_s += part.used_s
        row.credits += part.credits
        row.costs[part.currency] = row.costs.get(part.currency, ZERO) + part.cost
        row.provisional = True
    unfinished = hours if mark is None else hours.filter(hour__gte=mark)
    if _unit_split(group_by):
        for pair in (
            unfinished.annotate(g=_group_expr(group_by), u=_unit_expr()).order_by().values_list("g", "u").distinct()
        ):
            rows[pair].provisional = True
        return
    for value in unfinished.annotate(g=_group_expr(group_by)).order_by().values_list("g", flat=True).distinct():
        rows[value].provisional = True


def _report(
    *,
    project: Project | None,
    start: datetime,
    end: datetime,
    group_by: str,
    now: datetime | None,
    unsettled: bool = True,
) -> Report:
    slices = UsageSlice.objects.filter(hour__gte=start, hour__lt=end)
    hours = GpuUsageHour.objects.filter(hour__gte=start, hour__lt=end)
    if project is not None:
        slices, hours = slices.filter(project=project), hours.filter(project=project)
    rows = _aggregate(slices=slices, hours=hours, group_by=group_by)
    mark = final_until()
    parts = unsettled_parts(start=start, end=end, now=now or timezone.now(), project=project) if unsettled else []
    _settling(rows, hours=hours, parts=parts, group_by=group_by, mark=mark)
    listed, total = _finish(rows, group_by)
    storage = storage_charges(start=start, end=end, project=project)
    return Report(
        start=start,
        end=end,
        group_by=group_by,
        project=project,
        rows=listed,
        total=total,
        storage=storage,
        final_until=mark,
        reclaimed=_reclaimed(project=project, start=start, end=end),
    )


def _reclaimed(*, project: Project | None, start: datetime, end: datetime) -> dict[str, float]:
    from controlplane.accounting.reclaim import reclaimed_gpu_hours

    by_id = reclaimed_gpu_hours(project_ids=None if project is None else [project.pk], start=start, end=end)
    slugs = dict(Project.objects.filter(pk__in=list(by_id)).values_list("pk", "slug")) if by_id else {}
    return {slugs[pk]: hours for pk, hours in by_id.items()}


def project_report(
    *,
    project: Project,
    start: datetime,
    end: datetime,
    group_by: str = GroupBy.USER,
    now: datetime | None = None,
    unsettled: bool = True,
) -> Report:
    """One project's usage over [start, end), split by user, GPU model, day or reservation. A reservation not
    settled yet is in it with its figures so far, and its rows say ``provisional``; ``unsettled=False`` leaves
    such reservations out (a monthly statement records only what the ledger has charged)."""
    return _report(project=project, start=start, end=end, group_by=group_by, now=now, unsettled=unsettled)


def fleet_report(
    *, start: datetime, end: datetime, group_by: str = FleetGroupBy.PROJECT, now: datetime | None = None
) -> Report:
    """The whole fleet over [start, end). Telemetry of GPUs nobody held counts in the "(not held)" project row
    and in the GPU-model and day rows, so those show the fleet's utilization, not only the tenants'."""
    return _report(project=None, start=start, end=end, group_by=group_by, now=now)


def timeseries(
    *,
    start: datetime,
    end: datetime,
    bucket: str = Bucket.HOUR,
    project: Project | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Per hour or day: held GPU-hours, used and idle GPU-hours, mean utilization and energy, for charts; a
    point still settling (an unsettled reservation, an hour not rolled up for good) says ``provisional``."""
    report = _report(project=project, start=start, end=end, group_by=bucket, now=now)
    keep = (
        "held_gpu_hours",
        "used_gpu_hours",
        "idle_gpu_hours",
        "util_mean_percent",
        "energy_kwh",
        "credits",
        "provisional",
    )
    out = []
    for row in sorted(report.rows, key=lambda r: r.key):
        data = row.as_dict()
        out.append({"at": row.key, **{name: data[name] for name in keep}})
    return out


def ledger_charges(*, project: Project, start: datetime, end: datetime) -> Decimal:
    """The ledger's charges attributed to [start, end) by usage time: each charge of a settled reservation
    weighted by the share of its usage slices inside the range. Equal to the report's credits by construction:
    this is the check that the slices of every reservation still add up to its charge."""
    slices = UsageSlice.objects.filter(project=project)
    inside = dict(
        slices.filter(hour__gte=start, hour__lt=end)
        .values("reservation_id")
        .order_by()
        .annotate(c=Sum("credits"))
        .values_list("reservation_id", "c")
    )
    if not inside:
        return ZERO
    whole = dict(
        slices.filter(reservation_id__in=list(inside))
        .values("reservation_id")
        .order_by()
        .annotate(c=Sum("credits"))
        .values_list("reservation_id", "c")
    )
    charged = dict(
        LedgerEntry.objects.filter(reservation_id__in=list(inside), kind=EntryKind.CHARGE)
        .values("reservation_id")
        .order_by()
        .annotate(c=Sum("amount"))
        .values_list("reservation_id", "c")
    )
    total = ZERO
    for reservation_id, part in inside.items():
        charge = -(charged.get(reservation_id) or ZERO)
        total += charge if whole[reservation_id] == part else part * charge / whole[reservation_id]
    return total.quantize(Decimal("0.0001"))


def usage_records_visible_to(user: Any) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.filter(project__in=projects_visible_to(user)).select_related(
        "project", "gpu", "gpu_model", "user", "reservation"
    )


def statements_visible_to(user: Any) -> QuerySet[MonthlyStatement]:
    return MonthlyStatement.objects.filter(project__in=projects_visible_to(user)).select_related("project")
