"""The earliest-window search: when N GPUs of a spec will be free together for a duration."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, F
from django.utils.dateparse import parse_datetime

from controlplane.reservations import mig
from controlplane.reservations.placement import coverage, place
from controlplane.reservations.selectors import (
    SHORTLIST,
    _build,
    _ServerCount,
    _shortlist,
    candidate_servers,
    gpu_matches,
    placeable_gpus,
)
from controlplane.reservations.specs import GpuSpec, Window

EARLIEST_FIRST_STAGE = timedelta(days=1)


@dataclass
class _Fleet:
    """What one search query tells about the candidate GPUs: per server its GPUs (id, matching), and per
    GPU the stretches in which a window may start (epoch seconds; none: busy throughout)."""

    hostnames: dict[int, str]
    servers: dict[int, list[tuple[int, bool]]]
    starts: dict[int, list[tuple[float, float]]]
    seen: set[int]
    exact: dict[float, Any]  # allocation end (epoch) -> the stored value, to start at that instant exactly


def _gap_rows(spec: GpuSpec, *, now: datetime, last_start: datetime, duration: timedelta) -> list[tuple[Any, ...]]:
    """One query: every candidate GPU with its server, and the allocations that bound a gap long enough
    for the window (and each GPU's last one), with the neighbours worked out by LAG/LEAD in the database.

    The allocations are restricted to the horizon through the active-period index, and the timestamps are
    turned into epoch seconds only for the rows that come back: a small part of them for a long window."""
    gpus_sql, gpus_params = (
        placeable_gpus(spec)
        .annotate(m=ExpressionWrapper(gpu_matches(spec), output_field=BooleanField()))
        .order_by()
        .values(c_gpu=F("id"), c_server=F("server_id"), c_host=F("server__hostname"), c_match=F("m"))
        .query.sql_with_params()
    )
    ops = connection.ops
    horizon_end = ops.adapt_datetimefield_value(last_start + duration)
    start = ops.adapt_datetimefield_value(now)
    if connection.vendor == "postgresql":
        # The window functions run over the allocations alone, read in (gpu, start) order from the
        # active-period index, so nothing is sorted; the gap test compares timestamps, and only the rows
        # that come back are turned into epoch seconds (date_part is float8; EXTRACT would be numeric). The
        # test is a millisecond looser than the window so that the float check in _fleet() decides the
        # exact edge, as it always has.
        sql = f"""
            SELECT g.c_gpu, g.c_server, g.c_host, g.c_match, date_part('epoch', x.a), date_part('epoch', x.b),
                   date_part('epoch', x.prev_b), x.next_a IS NULL, x.b::text, x.prev_b::text
            FROM ({gpus_sql}) g
            LEFT JOIN (
                SELECT al.gpu_id, al.starts_at AS a, al.ends_at AS b,
                       LAG(al.ends_at) OVER w AS prev_b, LEAD(al.starts_at) OVER w AS next_a
                FROM reservations_allocation al
                WHERE al.active AND al.starts_at < %s AND al.ends_at > %s
                WINDOW w AS (PARTITION BY al.gpu_id ORDER BY al.starts_at)
            ) x ON x.gpu_id = g.c_gpu
               AND (x.next_a IS NULL
                    OR x.a >= GREATEST(COALESCE(x.prev_b, %s), %s) + %s - INTERVAL '1 millisecond')
        """  # noqa: S608 - the only interpolated SQL is the ORM's own; values are parameters
        with connection.cursor() as cursor:
            values: list[Any] = [*gpus_params, horizon_end, start, start, start, duration]
            cursor.execute(sql, values)
            return cursor.fetchall()
    t0, d = now.timestamp(), duration.total_seconds()

    def epoch(col: str) -> str:
        # SQLite keeps an instant as text, 'YYYY-MM-DD HH:MM:SS[.ffffff]' in UTC: the whole seconds, plus the
        # fraction as written. julianday() would be off by up to some ten microseconds, enough to miss a gap
        # exactly as long as the window; this sum rounds once, to the float that Python's timestamp() gives.
        # ('%%s' is how a literal '%s' survives the driver's placeholders.)
        return f"(CAST(strftime('%%s', {col}) AS INTEGER) + CAST(substr({col}, 20) AS REAL))"

    # The instants come back as text too: parsing tens of thousands of timestamps costs more than the
    # search, and only the one the answer starts at is ever parsed.
    sql = f"""
        SELECT x.gpu_id, x.server_id, x.hostname, x.m, {epoch("x.a")}, {epoch("x.b")}, {epoch("x.prev_b")},
               x.next_a IS NULL, x.b, x.prev_b
        FROM (
            SELECT g.c_gpu AS gpu_id, g.c_server AS server_id, g.c_host AS hostname, g.c_match AS m,
                   al.starts_at AS a, al.ends_at AS b,
                   LAG(al.ends_at) OVER w AS prev_b, LEAD(al.starts_at) OVER w AS next_a
            FROM ({gpus_sql}) g
            LEFT JOIN reservations_allocation al
              ON al.gpu_id = g.c_gpu AND al.active AND al.starts_at < %s AND al.ends_at > %s
            WINDOW w AS (PARTITION BY g.c_gpu ORDER BY al.starts_at)
        ) x
        WHERE x.a IS NULL OR x.next_a IS NULL
           OR {epoch("x.a")} >= MAX(COALESCE({epoch("x.prev_b")}, %s), %s) + %s
    """  # noqa: S608 - the only interpolated SQL is the ORM's own and fixed expressions; values are parameters
    with connection.cursor() as cursor:
        cursor.execute(sql, [*gpus_params, horizon_end, start, t0, t0, d])
        return cursor.fetchall()


@dataclass(frozen=True)
class _Fit:
    """A server on which the count fits at the search's first instant (epoch seconds ``t``, as text ``ts``
    unless it is ``now``): how many candidate GPUs it has, and how many of them are free then."""

    server: int
    hostname: str
    gpus: int
    t: float
    free: int
    ts: str | None


def _earliest_by_server(
    spec: GpuSpec, *, now: datetime, last_start: datetime, duration: timedelta
) -> tuple[list[_Fit], int] | None:
    """PostgreSQL, a GPU count: the whole search in one query that returns the servers at the first instant.

    Returns the servers on which the count fits at the first instant in ``[now, last_start]`` at which it
    fits on any, and the largest number of candidate GPUs on one server (0 when some server fits: the count
    is then known to fit one server, and that aggregate is never computed). None when no GPU is a candidate.

    The stretches in which a window may start are _fleet()'s, in the same float8 arithmetic (epoch seconds
    from date_part, ``now`` and the duration as Python computes them), so the instants are bit-for-bit those
    of the sweep in Python; the sweep is a running sum per server, starts before ends at one instant.
    """
    gpus_sql, gpus_params = (
        placeable_gpus(spec)
        .order_by()
        .values(c_gpu=F("id"), c_server=F("server_id"), c_host=F("server__hostname"))
        .query.sql_with_params()
    )
    ops = connection.ops
    horizon_end = ops.adapt_datetimefield_value(last_start + duration)
    start = ops.adapt_datetimefield_value(now)
    t0, t_last, d = now.timestamp(), last_start.timestamp(), duration.total_seconds()
    # The gap test runs on every allocation in the horizon, so it is kept cheap: the duration is an interval
    # of seconds alone (a timedelta of a day or more arrives as days, and adding days to a timestamptz goes
    # through the calendar). Every other step sees only the few rows that bound a gap long enough, or a
    # GPU's last one, and only the servers at the first instant come back.
    sql = f"""
        WITH g AS MATERIALIZED ({gpus_sql}),
        y AS (
            SELECT g.c_server, x.next_a IS NULL AS last, x.a IS NULL AS idle, date_part('epoch', x.a) AS a,
                   date_part('epoch', x.b) AS b, date_part('epoch', x.prev_b) AS pb, x.b AS bt, x.prev_b AS pbt
            FROM g
            LEFT JOIN (
                SELECT al.gpu_id, al.starts_at AS a, al.ends_at AS b,
                       LAG(al.ends_at) OVER w AS prev_b, LEAD(al.starts_at) OVER w AS next_a
                FROM reservations_allocation al
                WHERE al.active AND al.starts_at < %(h)s AND al.ends_at > %(now)s
                -- LAG and LEAD look at the partition, not the frame: the smallest frame costs the least.
                WINDOW w AS (PARTITION BY al.gpu_id ORDER BY al.starts_at ROWS BETWEEN CURRENT ROW AND CURRENT ROW)
            ) x ON x.gpu_id = g.c_gpu
               AND (x.next_a IS NULL
                    OR x.a >= GREATEST(COALESCE(x.prev_b, %(now)s), %(now)s)
                              + (make_interval(secs => %(d)s) - INTERVAL '1 millisecond'))
        ),
        iv AS (
            SELECT c_server, %(t0)s::float8 AS lo, %(tl)s::float8 AS hi, NULL::timestamptz AS lo_ts FROM y WHERE idle
            UNION ALL
            SELECT c_server, lo, LEAST(a - %(d)s, %(tl)s), lo_ts
            FROM (
                SELECT c_server, a,
                       CASE WHEN pb IS NULL OR pb < %(t0)s THEN %(t0)s ELSE pb END AS lo,
                       CASE WHEN pb IS NULL OR pb < %(t0)s THEN NULL ELSE pbt END AS lo_ts
                FROM y WHERE NOT idle
            ) gap
            WHERE a - %(d)s >= lo AND lo <= %(tl)s
            UNION ALL
            SELECT c_server, GREATEST(b, %(t0)s), %(tl)s, CASE WHEN b > %(t0)s THEN bt END FROM y
            WHERE last AND NOT idle AND GREATEST(b, %(t0)s) <= %(tl)s
        ),
        fit AS MATERIALIZED (
            SELECT c_server, t, depth, ts
            FROM (
                SELECT c_server, t, kind, ts,
                       SUM(delta) OVER (PARTITION BY c_server ORDER BY t, kind RANGE UNBOUNDED PRECEDING) AS depth
                FROM (
                    SELECT c_server, lo AS t, 0 AS kind, 1 AS delta, lo_ts AS ts FROM iv
                    UNION ALL
                    -- An end at the last instant comes after every start: it never lowers a depth that counts.
                    SELECT c_server, hi, 1, -1, NULL FROM iv WHERE hi < %(tl)s
                ) ev
            ) sweep
            WHERE kind = 0 AND depth >= %(n)s
        ),
        -- Starts at one instant are peers in the running sum, so they share its depth.
        best AS MATERIALIZED (
            SELECT c_server, t, max(depth) AS depth, max(ts::text) AS ts
            FROM fit WHERE t = (SELECT min(t) FROM fit) GROUP BY c_server, t
        )
        SELECT b.c_server, s.c_host, s.gpus, b.t, b.depth, b.ts, 0
        FROM best b
        JOIN (
            SELECT c_server, min(c_host) AS c_host, count(*) AS gpus FROM g
            WHERE c_server IN (SELECT c_server FROM best) GROUP BY c_server
        ) s ON s.c_server = b.c_server
        UNION ALL
        -- Only when no server fits: whether one could ever hold the count (else the general search answers).
        SELECT NULL, NULL, NULL, NULL, NULL, NULL,
               (SELECT max(gpus) FROM (SELECT count(*) AS gpus FROM g GROUP BY c_server) z)
        WHERE NOT EXISTS (SELECT 1 FROM best)
    """  # noqa: S608 - the only interpolated SQL is the ORM's own; values are parameters
    params: dict[str, Any] = dict(h=horizon_end, now=start, t0=t0, tl=t_last, d=d, n=spec.gpu_count or 1)
    with connection.cursor() as cursor:
        # The ORM's SQL uses positional placeholders; name them so the query can use its values by name.
        named = gpus_sql
        for i, value in enumerate(gpus_params):
            named = named.replace("%s", f"%(p{i})s", 1)
            params[f"p{i}"] = value
        cursor.execute(sql.replace(gpus_sql, named), params)
        rows = cursor.fetchall()
    if rows[0][0] is None:
        largest = rows[0][6]
        return None if largest is None else ([], largest)
    return [_Fit(sid, host, gpus, t, depth, ts) for sid, host, gpus, t, depth, ts, _ in rows], 0


def _fleet(rows: list[tuple[Any, ...]], *, now: datetime, last_start: datetime, duration: timedelta) -> _Fleet:
    d = duration.total_seconds()
    t0, t_last = now.timestamp(), last_start.timestamp()
    fleet = _Fleet({}, defaultdict(list), defaultdict(list), set(), {})
    servers, hostnames, starts, seen, exact = fleet.servers, fleet.hostnames, fleet.starts, fleet.seen, fleet.exact
    for gpu_id, server_id, hostname, m, a, b, prev_b, last, raw_b, raw_prev_b in rows:
        if gpu_id not in seen:
            seen.add(gpu_id)
            servers[server_id].append((gpu_id, bool(m)))
            hostnames[server_id] = hostname
            if a is None:
                starts[gpu_id] = [(t0, t_last)]  # no allocation in the horizon: free throughout
                continue
        if prev_b is None or prev_b < t0:
            gap_start = t0
        else:
            gap_start = prev_b
            exact[prev_b] = raw_prev_b
        if a - d >= gap_start and gap_start <= t_last:
            starts[gpu_id].append((gap_start, min(a - d, t_last)))
        if last:
            tail = b if b > t0 else t0
            if tail <= t_last:
                starts[gpu_id].append((tail, t_last))
                exact[b] = raw_b
    return fleet


def _starts_possible(fleet: _Fleet, gpu_id: int) -> list[tuple[float, float]]:
    return fleet.starts.get(gpu_id, [])


def _earliest_start(spec: GpuSpec, fleet: _Fleet, *, t0: float, t_last: float) -> float | None:
    """The first instant in ``[t0, t_last]`` at which the spec fits, as epoch seconds, or None: per GPU the
    stretches in which a window could start, and a sweep per server for the first instant enough overlap."""

    def starts(gid: int) -> list[tuple[float, float]]:
        return _starts_possible(fleet, gid)

    servers = fleet.servers
    if spec.whole_servers is not None:
        full: list[tuple[float, float]] = []
        for gpus in servers.values():
            if all(m for _, m in gpus):
                full.extend(coverage([iv for gid, _ in gpus for iv in starts(gid)], len(gpus)))
        stretches = coverage(full, spec.whole_servers)
        return stretches[0][0] if stretches else None
    count = spec.gpu_count or 1
    largest = max(sum(1 for _, m in gpus if m) for gpus in servers.values())
    if count > largest:
        stretches = coverage([iv for gpus in servers.values() for gid, m in gpus if m for iv in starts(gid)], count)
        return stretches[0][0] if stretches else None
    best: float | None = None
    for gpus in servers.values():
        matching = [gid for gid, m in gpus if m]
        if len(matching) < count:
            continue
        stretches = coverage([iv for gid in matching for iv in starts(gid)], count)
        if stretches and (best is None or stretches[0][0] < best):
            best = stretches[0][0]
    return best


def _counts_at(fleet: _Fleet, t: float, *, t0: float, t_last: float) -> list[_ServerCount]:
    """What _server_counts() reads from the database, worked out from the search's own rows at ``t``."""
    out = []
    for sid, gpus in fleet.servers.items():
        matching = [gid for gid, m in gpus if m]
        free = sum(1 for gid in matching if any(a <= t <= b for a, b in _starts_possible(fleet, gid)))
        out.append(_ServerCount(sid, fleet.hostnames[sid], len(gpus), len(matching), free))
    return out


def _exact_start(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = parse_datetime(str(value))
    assert parsed is not None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _earliest_in_sql(
    spec: GpuSpec, *, duration: timedelta, now: datetime, last: datetime
) -> tuple[bool, tuple[Window, list[int]] | None]:
    """earliest_window() past "now" for a GPU count that fits one server, on PostgreSQL: a row per server
    comes back rather than one per GPU. ``(False, None)`` when the count needs several servers, which the
    general search answers."""
    t0 = now.timestamp()
    # The first stage reads a day of allocations whatever the window's length (a window that long has had
    # its one instant, now, looked at already); an answer found in a stage is the earliest of all, as a
    # window starting inside it meets only allocations that the stage reads.
    first = now + max(EARLIEST_FIRST_STAGE - duration, timedelta(0))
    stages = [first, last] if now < first < last else [last]
    for stage_last in stages:
        found = _earliest_by_server(spec, now=now, last_start=stage_last, duration=duration)
        if found is None:
            return True, None
        fits, largest = found
        if fits:
            break
        if (spec.gpu_count or 1) > largest:
            return False, None
    else:
        return True, None
    best = fits[0].t
    exact = next((f.ts for f in fits if f.ts is not None), None)
    # ``best`` is now or the end of some allocation; take that instant exactly rather than a float's rounding.
    start = now if best == t0 or exact is None else _exact_start(exact)
    window = Window(start, start + duration)
    # Only the servers that fit at ``best`` come back; every other one has fewer than the count free then, and
    # the shortlist would skip it.
    counts = [_ServerCount(f.server, f.hostname, f.gpus, f.gpus, f.free) for f in fits]
    servers = _build(spec, window, _shortlist(spec, counts, SHORTLIST))
    proposal = place(servers, gpu_count=spec.gpu_count, whole_servers=spec.whole_servers)
    if proposal is None:  # an allocation landed meanwhile; the caller may ask again
        return True, None
    return True, (window, proposal)


def earliest_window(
    spec: GpuSpec, *, duration: timedelta, within: timedelta, now: datetime
) -> tuple[Window, list[int]] | None:
    """The earliest ``[t, t + duration)`` inside ``[now, now + within]`` that the placement rule can fill.

    First the cheap case, "now". On PostgreSQL, a GPU count that fits one server is then answered by
    _earliest_by_server(): the gaps, the stretches and the sweep per server all run in the database, which
    returns a row per server that fits. Otherwise one query returns every candidate GPU with the
    allocations that bound its long-enough gaps (first for the first day, then, if nothing fits there, for
    the whole horizon); per GPU the stretches in which a window could start; a sweep per server for the
    first instant at which enough overlap. Either way the free counts at that instant come from the same
    query, and the placement reads the topology of the shortlisted servers only, re-checking in SQL that
    their GPUs are free, so booking the answer gets those GPUs.
    """
    horizon_end = now + within
    if horizon_end - duration < now:
        return None
    # The cheap case first: "now", which is what a booking made now would get.
    proposal = place(
        candidate_servers(spec, Window(now, now + duration)), gpu_count=spec.gpu_count, whole_servers=spec.whole_servers
    )
    if proposal is not None:
        return Window(now, now + duration), proposal
    last = now + within - duration
    if connection.vendor == "postgresql" and spec.whole_servers is None:
        answered, found = _earliest_in_sql(spec, duration=duration, now=now, last=last)
        if answered:
            return found
    t0 = now.timestamp()
    # Most answers lie close to now: search the first day before reading the whole horizon's allocations.
    for stage_last in sorted({min(now + EARLIEST_FIRST_STAGE, last), last}):
        rows = _gap_rows(spec, now=now, last_start=stage_last, duration=duration)
        if not rows:
            return None
        fleet = _fleet(rows, now=now, last_start=stage_last, duration=duration)
        t_last = stage_last.timestamp()
        best = _earliest_start(spec, fleet, t0=t0, t_last=t_last)
        if best is not None:
            break
    else:
        return None
    # ``best`` is now or the end of some allocation; take that instant exactly rather than a float's rounding.
    start = now if best == t0 or fleet.exact.get(best) is None else _exact_start(fleet.exact[best])
    window = Window(start, start + duration)
    counts = _counts_at(fleet, best, t0=t0, t_last=t_last)
    servers = _build(spec, window, _shortlist(spec, counts, SHORTLIST))
    proposal = place(servers, gpu_count=spec.gpu_count, whole_servers=spec.whole_servers)
    if proposal is None:  # an allocation landed meanwhile; the caller may ask again
        return None
    return window, proposal


def earliest_booking(
    spec: GpuSpec, *, duration: timedelta, within: timedelta, now: datetime
) -> tuple[Window, list[int], str | None] | None:
    """The earliest window that a booking of ``spec`` fits in, with what it would get there: GPU ids and
    None, or for slices MigDevice ids and their profile (docs/fractional.md, "Slices by memory").

    A whole-GPU spec is earliest_window(). A slice spec tries, in the booking rule's order
    (``mig.slice_specs``, then whole GPUs for slices by memory), each choice's own earliest window; the
    earliest of them wins, the rule's order deciding a tie, which is what booking at that start takes."""
    if spec.mig_profile is None and not spec.slices:
        found = earliest_window(spec, duration=duration, within=within, now=now)
        return None if found is None else (found[0], found[1], None)
    best: tuple[Window, list[int], str | None] | None = None
    for profile_spec in mig.slice_specs(spec):
        slices = mig.earliest_slices(profile_spec, duration=duration, within=within, now=now)
        if slices is not None and (best is None or slices[0].starts_at < best[0].starts_at):
            best = (slices[0], slices[1], profile_spec.mig_profile)
    if spec.slices and (best is None or best[0].starts_at > now):
        whole = earliest_window(spec.whole_only, duration=duration, within=within, now=now)
        if whole is not None and (best is None or whole[0].starts_at < best[0].starts_at):
            best = (whole[0], whole[1], None)
    return best
