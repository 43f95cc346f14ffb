"""Live container logs: the agents' chunks in (``logs_ingest``), a reservation's output out (snapshot, follow).

A launch's log is a byte stream addressed by offset from the start of the container's output. Ingest is
idempotent by offset, so an agent may resend anything: bytes below ``received`` are skipped, an overlapping
chunk adds only its new part, and a chunk beyond ``received`` leaves a hole (the agent dropped that output
while it could not reach us). At most ``DISPATCH_LOG_KEEP_BYTES`` per launch are kept; the oldest go first.

Readers address a reservation's output with a cursor, ``<launch pk>-<offset>`` per launch joined by ``.``:
byte positions, not row ids, because chunks of two servers commit in any order and a row id cursor would
skip the one that committed late.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from controlplane.core.errors import ValidationFailed
from controlplane.dispatch.choices import FINAL_LAUNCH_STATES
from controlplane.dispatch.models import Launch, LaunchLog, LaunchLogChunk
from controlplane.inventory.models import Server
from controlplane.reservations.choices import FINAL_STATES
from controlplane.reservations.models import Reservation
from nodeagent import schema

# Contiguous writes are merged into one row up to this size: a line every quarter second stays one row per
# 64 KiB, not thousands, while a merge rewrites at most this much.
MERGE_BYTES = 64 * 1024
# A launch that ended without its agent sending an end of file (its node is gone, or the agent ships no
# live logs) counts as complete this long after it ended.
EOF_WAIT = timedelta(seconds=30)
# The most bytes of one launch one read hands out; the rest comes on the next read.
READ_BYTES = 256 * 1024

# ASCII digits only and no trailing newline (Python's \d and $ admit both): the API schema states this pattern
# for ``after`` and Last-Event-ID (CURSOR_PATTERN), so what it admits is exactly what parses.
_CURSOR_PART = re.compile(r"([0-9]{1,18})-([0-9]{1,18})")
CURSOR_PATTERN = r"^(?:[0-9]{1,18}-[0-9]{1,18}(?:\.[0-9]{1,18}-[0-9]{1,18})*)?$"


# -- ingest --------------------------------------------------------------------------------------------------


def _decoded(batch: schema.LogBatch) -> list[tuple[schema.LogChunk, bytes]]:
    """Every chunk's bytes, or a 400 naming the first bad one; nothing is written before all are valid."""
    out = []
    for index, chunk in enumerate(batch.chunks):
        try:
            data = base64.b64decode(chunk.data, validate=True)
        except (binascii.Error, ValueError):
            name = f"chunks.{index}.data"
            raise ValidationFailed(f"{name}: not valid base64.", fields={name: ["Not valid base64."]}) from None
        if len(data) > schema.MAX_LOG_CHUNK_BYTES:
            name = f"chunks.{index}.data"
            message = f"At most {schema.MAX_LOG_CHUNK_BYTES} bytes per chunk."
            raise ValidationFailed(f"{name}: {message}", fields={name: [message]})
        out.append((chunk, data))
    return out


def _locked_logs(launches: Iterable[Launch]) -> dict[int, LaunchLog]:
    """The launches' logs, created where missing, row-locked in primary key order (no deadlock between two
    agents' batches)."""
    ids = [launch.pk for launch in launches]
    missing = set(ids) - set(LaunchLog.objects.filter(launch_id__in=ids).values_list("launch_id", flat=True))
    if missing:
        try:
            with transaction.atomic():
                LaunchLog.objects.bulk_create([LaunchLog(launch_id=pk) for pk in sorted(missing)])
        except IntegrityError:
            pass  # a concurrent batch created them first; the lock below waits for it
    return {
        log.launch_id: log for log in LaunchLog.objects.select_for_update().filter(launch_id__in=ids).order_by("pk")
    }


def _append(log: LaunchLog, offset: int, data: bytes) -> None:
    """Add bytes at ``offset`` (at or beyond ``log.received``): merged into the last row when contiguous."""
    last = LaunchLogChunk.objects.filter(log=log).order_by("-offset").first()
    if last is not None and last.end == offset and last.end - last.offset + len(data) <= MERGE_BYTES:
        last.data = bytes(last.data) + data
        last.end = offset + len(data)
        last.save(update_fields=["data", "end"])
    else:
        LaunchLogChunk.objects.create(log=log, offset=offset, end=offset + len(data), data=data)
    log.kept_bytes += len(data)
    log.received = offset + len(data)


def _trim(log: LaunchLog, keep: int) -> None:
    """Drop the oldest bytes until at most ``keep`` remain; a row straddling the limit loses its head."""
    excess = log.kept_bytes - keep
    if excess > 0:
        for chunk in LaunchLogChunk.objects.filter(log=log).order_by("offset"):
            size = chunk.end - chunk.offset
            if size <= excess:
                chunk.delete()
                excess -= size
                log.kept_bytes -= size
                continue
            LaunchLogChunk.objects.filter(pk=chunk.pk).update(
                offset=chunk.offset + excess, data=bytes(chunk.data)[excess:]
            )
            log.kept_bytes -= excess
            break
    first = LaunchLogChunk.objects.filter(log=log).order_by("offset").values_list("offset", flat=True).first()
    log.kept_from = log.received if first is None else first


def _apply(log: LaunchLog, chunks: Sequence[tuple[schema.LogChunk, bytes]], keep: int) -> bool:
    changed = False
    for chunk, data in sorted(chunks, key=lambda item: item[0].offset):
        end = chunk.offset + len(data)
        if end > log.received:
            start = max(chunk.offset, log.received)
            _append(log, start, data[start - chunk.offset :])
            changed = True
        if chunk.eof and not log.eof and end >= log.received:
            log.eof = True
            changed = True
    if changed:
        _trim(log, keep)
    return changed


def logs_ingest(*, server: Server, batch: schema.LogBatch, now: datetime) -> dict[str, int]:
    """Store an agent's log chunks; per launch of ``server`` in the batch, the offset it should send next.

    A launch of another server (or none) is left out of the answer and nothing of it is written: an agent
    speaks only for its own node.
    """
    decoded = _decoded(batch)
    ids = sorted({chunk.launch_id for chunk, _ in decoded})
    keep = int(settings.DISPATCH_LOG_KEEP_BYTES)
    with transaction.atomic():
        launches = {launch.launch_id: launch for launch in Launch.objects.filter(server=server, launch_id__in=ids)}
        logs = _locked_logs(launches.values())
        by_launch: dict[str, list[tuple[schema.LogChunk, bytes]]] = {}
        for chunk, data in decoded:
            if chunk.launch_id in launches:
                by_launch.setdefault(chunk.launch_id, []).append((chunk, data))
        for launch_id, chunks in by_launch.items():
            log = logs[launches[launch_id].pk]
            if _apply(log, chunks, keep):
                log.updated_at = now
                log.save(update_fields=["received", "kept_from", "kept_bytes", "eof", "updated_at"])
        return {launch_id: logs[launch.pk].received for launch_id, launch in launches.items()}


# -- reading -------------------------------------------------------------------------------------------------


def parse_cursor(value: str, *, name: str) -> dict[int, int]:
    """``<launch pk>-<offset>`` parts joined by ``.`` (CURSOR_PATTERN), or empty; a 400 naming ``name`` otherwise."""
    if not value:
        return {}
    cursor: dict[int, int] = {}
    for part in value.split("."):
        match = _CURSOR_PART.fullmatch(part)
        if match is None:
            message = "Not a log cursor (as an event's id or a log answer's cursor gives it)."
            raise ValidationFailed(f"{name}: {message}", fields={name: [message]})
        cursor[int(match[1])] = int(match[2])
    return cursor


def format_cursor(cursor: dict[int, int]) -> str:
    return ".".join(f"{pk}-{offset}" for pk, offset in sorted(cursor.items()))


def complete_utf8(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a character boundary: a character split between two writes
    is sent whole with the next one instead of as two replacement characters."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last lead (or ASCII) byte
            need = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if 0xF0 <= byte < 0xF8 else 1
            return len(data) - back if need > back else len(data)
    return len(data)


@dataclass
class Piece:
    """Output of one launch from ``offset``; ``cut`` bytes before it were dropped (or never arrived)."""

    launch: Launch
    offset: int
    data: bytes
    cut: int


@dataclass
class Snapshot:
    launch: Launch
    log: LaunchLog | None
    text: str = ""
    cut: int = 0  # bytes dropped before ``text``
    gaps: list[dict[str, int]] = field(default_factory=list)


def reservation_launches(reservation: Reservation) -> QuerySet[Launch]:
    return Launch.objects.filter(reservation=reservation).select_related("server", "log").order_by("generation", "pk")


def log_of(launch: Launch) -> LaunchLog | None:
    try:
        return launch.log
    except LaunchLog.DoesNotExist:
        return None


def snapshot(reservation: Reservation) -> list[Snapshot]:
    """Each launch's kept output as text (invalid UTF-8 replaced), with the holes in it."""
    out = []
    for launch in reservation_launches(reservation):
        log = log_of(launch)
        snap = Snapshot(launch=launch, log=log)
        if log is not None:
            parts: list[bytes] = []
            at: int | None = None
            # Only up to ``received`` as read with the launch: bytes committed since come with the cursor's next read.
            for chunk in LaunchLogChunk.objects.filter(log=log, offset__lt=log.received).order_by("offset"):
                if at is None:
                    snap.cut = chunk.offset  # read here, not from the log row: a trim may have run in between
                elif chunk.offset > at:
                    snap.gaps.append({"offset": at, "bytes": chunk.offset - at})
                parts.append(bytes(chunk.data)[: log.received - chunk.offset])
                at = min(chunk.end, log.received)
            if at is None:
                snap.cut = log.received
            snap.text = b"".join(parts).decode("utf-8", errors="replace")
        out.append(snap)
    return out


def read_after(launch: Launch, log: LaunchLog, position: int) -> list[Piece]:
    """What ``launch`` wrote from ``position`` on, at most ``READ_BYTES``, one piece per contiguous run. The
    end stops short of a split character unless the log is complete."""
    pieces: list[Piece] = []
    budget = READ_BYTES
    for chunk in LaunchLogChunk.objects.filter(log=log, end__gt=position).order_by("offset"):
        start = max(position, chunk.offset)
        data = bytes(chunk.data)[start - chunk.offset :][:budget]
        cut = start - position
        if pieces and cut == 0:
            pieces[-1].data += data
        else:
            pieces.append(Piece(launch=launch, offset=start, data=data, cut=cut))
        position = start + len(data)
        budget -= len(data)
        if budget <= 0:
            break
    if pieces and not (log.eof and position >= log.received):
        last = pieces[-1]
        last.data = last.data[: complete_utf8(last.data)]
        if not last.data:
            pieces.pop()
    return pieces


def launch_complete(launch: Launch, log: LaunchLog | None, now: datetime) -> bool:
    """Whether ``launch`` will write no more: it ended, and its agent sent the end of its output (or never will)."""
    if launch.state not in FINAL_LAUNCH_STATES:
        return False
    if log is not None and log.eof:
        return True
    if not launch.container_id and launch.started_at is None:
        return True  # it never ran: there is no output to wait for
    return now - (launch.finished_at or launch.updated_at) >= EOF_WAIT


def reservation_finished(reservation: Reservation, launches: Sequence[Launch], now: datetime) -> bool:
    """Every launch of a reservation that has ended wrote its last byte."""
    return reservation.state in FINAL_STATES and all(launch_complete(x, log_of(x), now) for x in launches)
