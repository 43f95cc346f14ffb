"""Monthly statements: a project's report for a closed month, generated once and kept with its CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from controlplane.accounting.choices import GroupBy
from controlplane.accounting.models import GpuUsageHour, MonthlyStatement, UsageSlice
from controlplane.accounting.selectors import COLUMNS, Report, project_report
from controlplane.accounting.timeutil import month_start, next_month
from controlplane.accounts.models import Project
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.ledger.services import hour_key_for


def report_csv(
    rows: Iterable[dict[str, Any]],
    total: dict[str, Any] | None = None,
    storage: dict[str, Any] | None = None,
    total_credits: Any = None,
    *,
    reclaimed_gpu_hours: float | None = None,
) -> str:
    """The report's rows (and its total line) as CSV, in the columns of ``COLUMNS``; after them, when the range
    had storage charges, a line for the volumes' storage and one for the credits of both."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    extra = []
    if storage is not None and storage["gib_hours"]:
        label = f"Storage ({storage['gib_hours']} GiB-hours)"
        extra.append({"key": "storage", "label": label, "credits": storage["credits"]})
        extra.append({"key": "total_with_storage", "label": "Total with storage", "credits": total_credits})
    if reclaimed_gpu_hours:
        # Idle reclamation (docs/efficiency.md): the GPU-hours given back, beside what was booked and used.
        label = f"Idle reclaimed ({reclaimed_gpu_hours} GPU-hours)"
        extra.append({"key": "idle_reclaimed", "label": label})
    for row in [*rows, *([total] if total else []), *extra]:
        values = []
        for name in COLUMNS:
            value = row.get(name)
            if name == "cost" and value is None:
                value = " ".join(f"{c} {a}" for c, a in row.get("costs", {}).items())
            values.append("" if value is None else value)
        writer.writerow(values)
    return out.getvalue()


def _jsonable(report: Report) -> dict[str, Any]:
    data = report.as_dict()

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, datetime):
            return value.isoformat()
        return str(value) if not isinstance(value, (int, float, str, bool, type(None))) else value

    return plain(data)  # type: ignore[no-any-return]


@transaction.atomic
def statement_generate(*, project: Project, month: datetime) -> MonthlyStatement:
    """The statement of ``project`` for the month holding ``month``; generated once, then returned as kept."""
    start = month_start(month)
    key = start.strftime("%Y-%m")
    existing = MonthlyStatement.objects.filter(project=project, period_key=key).first()
    if existing is not None:
        return existing
    report = project_report(project=project, start=start, end=next_month(start), group_by=GroupBy.USER, unsettled=False)
    data = _jsonable(report)
    try:
        with transaction.atomic():
            return MonthlyStatement.objects.create(
                project=project,
                period_key=key,
                period_start=start,
                period_end=next_month(start),
                rows=data["rows"],
                totals={**data["totals"], "storage": data["storage"], "total_credits": data["total_credits"]},
                csv=report_csv(data["rows"], data["totals"], data["storage"], data["total_credits"]),
                generated_at=timezone.now(),
            )
    except IntegrityError:  # a concurrent run generated it first
        return MonthlyStatement.objects.get(project=project, period_key=key)


def statements_generate_due(*, now: datetime | None = None, limit: int = 50) -> int:
    """The beat task: statements of the month that closed last, for projects with usage in it, not yet made."""
    now = now or timezone.now()
    end = month_start(now)
    start = month_start(end - timedelta(days=1))
    key = start.strftime("%Y-%m")
    used = Exists(UsageSlice.objects.filter(project=OuterRef("pk"), hour__gte=start, hour__lt=end))
    telemetry = Exists(GpuUsageHour.objects.filter(project=OuterRef("pk"), hour__gte=start, hour__lt=end))
    stored = Exists(
        LedgerEntry.objects.filter(
            project=OuterRef("pk"),
            kind=EntryKind.CHARGE,
            reservation__isnull=True,
            period_key__gte=hour_key_for(start),
            period_key__lt=hour_key_for(end),
        )
    )
    done_already = Exists(MonthlyStatement.objects.filter(project=OuterRef("pk"), period_key=key))
    due = Project.objects.filter(used | telemetry | stored).filter(~done_already).order_by("pk")[:limit]
    count = 0
    for project in due:
        statement_generate(project=project, month=start)
        count += 1
    return count
