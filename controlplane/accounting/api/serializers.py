from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from rest_framework import serializers

from controlplane.accounting.choices import Bucket, FleetGroupBy, GroupBy, Period
from controlplane.accounting.efficiency import PROFILING_STATES
from controlplane.accounting.models import MonthlyStatement, UsageRecord
from controlplane.accounting.timeutil import is_on_the_hour, month_start, next_month, utc
from controlplane.accounts.models import Project
from controlplane.core.api.fields import NAIVE_MESSAGE

MAX_RANGE = timedelta(days=400)


def _as_datetime(value: str, field: str) -> datetime:
    """A range's bound: an ISO date (a UTC day, as ``date`` is) or a date-time with its time zone."""
    try:
        if len(value) == 10:
            return datetime.combine(date.fromisoformat(value), time(0), tzinfo=UTC)
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise serializers.ValidationError({field: ["Give an ISO 8601 date or date-time on the hour."]}) from exc
    if parsed.tzinfo is None:
        raise serializers.ValidationError({field: [NAIVE_MESSAGE]})
    return utc(parsed)


_SLUG_MAX = Project._meta.get_field("slug").max_length


class RangeQuerySerializer(serializers.Serializer):
    """A range: ``start``/``end`` (dates or date-times on the hour, end exclusive) or ``period`` and ``date``.
    With neither, the current UTC month."""

    start = serializers.CharField(required=False, max_length=64)
    end = serializers.CharField(required=False, max_length=64)
    period = serializers.ChoiceField(choices=Period.choices, required=False)
    date = serializers.DateField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("start") or attrs.get("end"):
            if not (attrs.get("start") and attrs.get("end")):
                missing = "end" if attrs.get("start") else "start"
                raise serializers.ValidationError({missing: ["Give both start and end."]})
            start, end = _as_datetime(attrs["start"], "start"), _as_datetime(attrs["end"], "end")
        else:
            anchor = datetime.combine(attrs.get("date") or datetime.now(UTC).date(), time(0), tzinfo=UTC)
            period = attrs.get("period") or Period.MONTH
            if period == Period.DAY:
                start, end = anchor, anchor + timedelta(days=1)
            elif period == Period.WEEK:
                start = anchor - timedelta(days=anchor.weekday())
                end = start + timedelta(days=7)
            else:
                start = month_start(anchor)
                end = next_month(start)
        for name, value in (("start", start), ("end", end)):
            if not is_on_the_hour(value):
                raise serializers.ValidationError({name: ["Must be on the hour: usage is split by UTC hour."]})
        if end <= start:
            raise serializers.ValidationError({"end": ["Must be after start."]})
        if end - start > MAX_RANGE:
            raise serializers.ValidationError({"end": [f"A report covers at most {MAX_RANGE.days} days."]})
        attrs["start"], attrs["end"] = start, end
        return attrs


class ProjectReportQuerySerializer(RangeQuerySerializer):
    project = serializers.CharField(max_length=_SLUG_MAX, help_text="Project slug.")
    group_by = serializers.ChoiceField(choices=GroupBy.choices, default=GroupBy.USER)


class FleetReportQuerySerializer(RangeQuerySerializer):
    group_by = serializers.ChoiceField(choices=FleetGroupBy.choices, default=FleetGroupBy.PROJECT)


class TimeseriesQuerySerializer(RangeQuerySerializer):
    project = serializers.CharField(
        required=False, max_length=_SLUG_MAX, help_text="Project slug; operators may leave it out."
    )
    bucket = serializers.ChoiceField(choices=Bucket.choices, default=Bucket.DAY)


class ReportRowSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # a field named like Field.label
    booked_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField()
    held_gpu_hours = serializers.FloatField()
    idle_gpu_hours = serializers.FloatField()
    util_mean_percent = serializers.FloatField(allow_null=True)
    low_utilization = serializers.BooleanField()
    energy_kwh = serializers.FloatField()
    credits = serializers.DecimalField(max_digits=16, decimal_places=4)
    cost = serializers.DecimalField(max_digits=16, decimal_places=4, allow_null=True)
    currency = serializers.CharField(allow_blank=True)
    costs = serializers.DictField(child=serializers.DecimalField(max_digits=16, decimal_places=4))
    unit = serializers.CharField(
        allow_blank=True,
        help_text='Grouped by GPU model: "gpu" for whole GPUs, the MIG profile ("1g.10gb") for slices, each a row '
        "of its own beside its model's whole GPUs; blank for the other groupings.",
    )
    provisional = serializers.BooleanField(
        help_text="Still settling: it counts a reservation not settled yet (its figures so far, credits estimated "
        "at the GPU model's billing weight until the ledger charges it) or an hour whose telemetry rollup is not "
        "final (utilization, idle time and energy may still change)."
    )


class StorageVolumeSerializer(serializers.Serializer):
    volume = serializers.CharField()
    gib_hours = serializers.IntegerField()
    credits = serializers.DecimalField(max_digits=16, decimal_places=4)


class StorageSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # a field named like Field.label
    gib_hours = serializers.IntegerField(help_text="GiB-hours of the volumes' size limits charged for the range.")
    credits = serializers.DecimalField(max_digits=16, decimal_places=4)
    uncharged = serializers.DecimalField(
        max_digits=16, decimal_places=4, help_text="What could not be charged: the project's credits had run out."
    )
    volumes = StorageVolumeSerializer(many=True, help_text="Per volume (a project's report only).")


class ReportSerializer(serializers.Serializer):
    project = serializers.CharField(allow_null=True)
    provisional = serializers.BooleanField(help_text="Some row is still settling (see the rows' ``provisional``).")
    final_until = serializers.DateTimeField(
        allow_null=True,
        help_text="Telemetry of hours before this is final; later hours are still being rolled up. Null before "
        "the first rollup.",
    )
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    group_by = serializers.CharField()
    rows = ReportRowSerializer(many=True)
    totals = ReportRowSerializer()
    storage = StorageSerializer(help_text="Volumes' storage charges for the hours of the range.")
    total_credits = serializers.DecimalField(
        max_digits=16, decimal_places=4, help_text="totals.credits (GPUs) plus storage.credits."
    )
    reclaimed_gpu_hours = serializers.FloatField(
        help_text="GPU-hours released by idle reclamation (cut ends in the range, not kept)."
    )
    reclaimed_by_project = serializers.DictField(
        child=serializers.FloatField(), help_text="The same per project slug (the fleet report lists every project)."
    )


class TimeseriesPointSerializer(serializers.Serializer):
    at = serializers.CharField()
    held_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField()
    idle_gpu_hours = serializers.FloatField()
    util_mean_percent = serializers.FloatField(allow_null=True)
    energy_kwh = serializers.FloatField()
    credits = serializers.DecimalField(max_digits=16, decimal_places=4)
    provisional = serializers.BooleanField(
        help_text="Still settling: an unsettled reservation or an hour whose rollup is not final."
    )


class UsageRecordSerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Project] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    reservation = serializers.UUIDField(source="reservation.public_id", read_only=True)
    gpu = serializers.CharField(source="gpu.uuid", read_only=True)
    gpu_model = serializers.CharField(source="gpu_model.name", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "project",
            "reservation",
            "gpu",
            "gpu_model",
            "user",
            "booked_start",
            "booked_end",
            "started_at",
            "finished_at",
            "measured",
            "booked_s",
            "gpu_seconds",
            "credits",
            "cost",
            "currency",
            "created_at",
        ]


class StatementSerializer(serializers.ModelSerializer):
    project: serializers.SlugRelatedField[Project] = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = MonthlyStatement
        fields = ["id", "project", "period_key", "period_start", "period_end", "totals", "rows", "generated_at"]


class EfficiencyQuerySerializer(serializers.Serializer):
    month = serializers.RegexField(
        # Years 2000-2999: the statement compares with the month before and the fleet, and a year 0 or 9999's
        # neighbours are no dates at all.
        r"^2\d{3}-(0[1-9]|1[0-2])$",
        required=False,
        max_length=7,
        help_text="The UTC month, YYYY-MM; the current month when left out.",
        error_messages={"invalid": "Give a month as YYYY-MM."},
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        value = attrs.get("month")
        attrs["month"] = (
            datetime(int(value[:4]), int(value[5:]), 1, tzinfo=UTC) if value else month_start(datetime.now(UTC))
        )
        return attrs


class ProjectEfficiencyQuerySerializer(EfficiencyQuerySerializer):
    project = serializers.CharField(max_length=_SLUG_MAX, help_text="Project slug.")


class EfficiencyFiguresSerializer(serializers.Serializer):
    held_gpu_hours = serializers.FloatField()
    idle_gpu_hours = serializers.FloatField()
    idle_share = serializers.FloatField(allow_null=True, help_text="idle / held GPU-hours.")
    util_mean_percent = serializers.FloatField(allow_null=True, help_text="Time-weighted mean utilization.")
    low_util_share = serializers.FloatField(
        allow_null=True, help_text="Share of held GPU-hours (with a reading) in hours under the low-utilization line."
    )
    energy_kwh = serializers.FloatField(help_text="The GPUs' energy.")
    facility_energy_kwh = serializers.FloatField(help_text="GPU energy x the site's PUE.")
    energy_cost = serializers.CharField(help_text="Facility energy at the site's price per kWh.")
    energy_currency = serializers.CharField()
    energy_wh_per_gpu_hour = serializers.FloatField(allow_null=True)
    credits = serializers.CharField(help_text="Credits charged (settled reservations).")
    idle_credits = serializers.CharField(help_text="The credits' share spent on idle GPU time.")
    profiling = serializers.ChoiceField(
        choices=list(PROFILING_STATES),
        help_text="Whether the held time has DCGM profiling readings (the GPM API, Hopper and newer): all of it, "
        "some, or none (utilization only; the profiling figures are null).",
    )
    profiled_gpu_hours = serializers.FloatField(help_text="Held GPU-hours in hours with an SM-active reading.")
    sm_active_percent = serializers.FloatField(
        allow_null=True,
        help_text="Profiling reading: mean DCGM_FI_PROF_SM_ACTIVE, weighted by held time; null: not measured.",
    )
    tensor_active_percent = serializers.FloatField(
        allow_null=True,
        help_text="Profiling reading: mean DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, weighted by held time; null: not measured.",
    )
    dram_active_percent = serializers.FloatField(
        allow_null=True,
        help_text="Profiling reading: mean DCGM_FI_PROF_DRAM_ACTIVE, weighted by held time; null: not measured.",
    )


class PreviousFiguresSerializer(EfficiencyFiguresSerializer):
    period = serializers.CharField()


class WastedReservationSerializer(EfficiencyFiguresSerializer):
    reservation = serializers.UUIDField(allow_null=True)
    name = serializers.CharField()


class EfficiencyStatementSerializer(serializers.Serializer):
    project = serializers.CharField()
    period = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    provisional = serializers.BooleanField()
    low_util_percent = serializers.FloatField()
    totals = EfficiencyFiguresSerializer()
    previous = PreviousFiguresSerializer()
    fleet = EfficiencyFiguresSerializer()
    reservations = WastedReservationSerializer(many=True, help_text="Ranked by waste: idle credits, then idle hours.")


class RankedProjectSerializer(EfficiencyFiguresSerializer):
    rank = serializers.IntegerField()
    project = serializers.CharField()


class EfficiencyRankingSerializer(serializers.Serializer):
    period = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    provisional = serializers.BooleanField()
    fleet = EfficiencyFiguresSerializer()
    projects = RankedProjectSerializer(many=True)
