"""Fair share between projects within a class: Slurm's classic formula, F = 2^(-U/S) (docs/scheduling.md).

U is a project's decayed usage over the decayed usage of every project; S is its shares over the shares of
the projects that compete (those with queued work or decayed usage). Usage is what ran: the GPU-seconds of
accounting's usage slices (``used_s``, from the container start and stop the agent saw), not weighted by the
GPU model's billing weight (an hour of any GPU counts the same; what it costs is the ledger's business). A
slice counts with the weight 2^(-age / half-life), its age taken from the middle of its UTC day: the usage is
read as one aggregate per (project, day), so a pass costs two queries whatever the number of requests.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Sum
from django.db.models.functions import TruncDay

from controlplane.accounting.models import UsageSlice
from controlplane.scheduling.models import ProjectShare

# Usage older than this many half-lives weighs under 0.4% and is not read.
HORIZON_HALF_LIVES = 8


@dataclass(frozen=True)
class FairShare:
    """One project's standing: decayed GPU-hours, the normalized usage U and shares S, and the factor."""

    usage_gpu_hours: float
    shares: int
    normalized_usage: float
    normalized_shares: float
    factor: float


def half_life() -> timedelta:
    return timedelta(days=float(settings.SCHEDULING_FAIRSHARE_HALF_LIFE))


def _decayed_usage(*, now: datetime) -> dict[int, float]:
    """Every project's decayed GPU-seconds (one query: a sum per project and UTC day)."""
    h = half_life()
    rows = (
        UsageSlice.objects.filter(hour__gte=now - h * HORIZON_HALF_LIVES, hour__lt=now)
        .annotate(day=TruncDay("hour"))
        .values("project_id", "day")
        .annotate(used=Sum("used_s"))
        .order_by()
    )
    usage: dict[int, float] = defaultdict(float)
    h_s = h.total_seconds()
    for row in rows:
        middle = min(row["day"] + timedelta(hours=12), now)
        usage[row["project_id"]] += float(row["used"] or 0) * 2 ** (-(now - middle).total_seconds() / h_s)
    return usage


def fair_shares(project_ids: Iterable[int], *, now: datetime) -> dict[int, FairShare]:
    """The standing of each of ``project_ids`` (two queries: the usage, and the shares)."""
    wanted = set(project_ids)
    usage = _decayed_usage(now=now)
    competing = wanted | {pid for pid, used in usage.items() if used > 0}
    shares = {pid: 1 for pid in competing}
    shares.update(dict(ProjectShare.objects.filter(project_id__in=competing).values_list("project_id", "shares")))
    total_usage = sum(usage.values())
    total_shares = sum(shares.values()) or 1
    out = {}
    for pid in wanted:
        u = usage.get(pid, 0.0) / total_usage if total_usage > 0 else 0.0
        s = shares[pid] / total_shares
        out[pid] = FairShare(
            usage_gpu_hours=usage.get(pid, 0.0) / 3600,
            shares=shares[pid],
            normalized_usage=u,
            normalized_shares=s,
            factor=2 ** (-u / s),
        )
    return out
