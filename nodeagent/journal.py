"""The journal: what the agent has to tell the control plane and has not yet told it, on disk.

Everything a heartbeat carries besides the node's facts (GPU samples, agent events such as SSH sessions and
fences, container reports) goes into the journal first, and a heartbeat takes the oldest of it; only an answered
heartbeat removes what it carried (``commit``). While the control plane cannot answer (down, restarting, its
database away) the journal grows in the state directory, survives a SIGKILL or restart of the agent, and is
replayed in order, in heartbeat-sized batches, once the control plane answers again. The control plane takes a
sample once (a GPU's samples are de-duplicated by time, so the order matters) and folds container reports by
launch, so what ran is accounted to the second (docs/agent.md, "The journal").

Layout: one directory per kind (``samples``, ``events``, ``containers``), each a run of segment files named by the
sequence number of their first record, one record per line (``<seq>\\t<json>``), plus ``acked``, the last sequence
number the control plane has. Records are written straight to the kernel (unbuffered), so a killed agent loses
nothing; ``sync`` makes them durable against a power loss too.

Container output waiting for the live-log endpoint is kept beside them, under ``logs/`` (nodeagent.logship, which
attaches itself with ``attach_logs``): acknowledged per launch by offset rather than in order, so it keeps its own
files, but under the same bound.

The bound (``max_bytes``, the agent's ``--journal-max-bytes``, 64 MiB by default) covers every kind. Over it, the
oldest go first: GPU samples (whole segments), then container output (the oldest bytes of the launch holding the
most; the control plane records the hole), then events; container reports (starts and exits, the ground of usage
and charges) are never dropped. Drops are counted and reported in the next heartbeat as an ``agent`` event.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from nodeagent import schema

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MAX_SEGMENT_BYTES = 1024 * 1024
MIN_SEGMENT_BYTES = 4096
# The kinds of record, and the order in which they are dropped when the journal is over its bound (None: never).
SAMPLES, EVENTS, CONTAINERS, LOGS = "samples", "events", "containers", "logs"
DROP_ORDER = (SAMPLES, LOGS, EVENTS)


@dataclass
class _Segment:
    path: Path
    first_seq: int
    last_seq: int
    pending: int  # records not yet acknowledged
    size: int  # bytes in the file
    start: int = 0  # byte offset of the first record not yet acknowledged


@dataclass
class _Taken:
    """Where a take ended in one stream: its last record's sequence number, segment and the offset after it."""

    last_seq: int
    path: Path
    end: int


class _Stream:
    """One kind of record: an append-only run of segment files and the sequence number acknowledged."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        directory.mkdir(parents=True, exist_ok=True)
        self.acked = self._read_acked()
        self.segments: list[_Segment] = []
        self._active: IO[bytes] | None = None
        self._load()
        self.next_seq = max([self.acked, *(s.last_seq for s in self.segments)]) + 1

    # -- on disk ---------------------------------------------------------------------------------------------

    def _read_acked(self) -> int:
        try:
            return int((self.directory / "acked").read_text().strip())
        except (OSError, ValueError):
            return 0

    def _write_acked(self) -> None:
        tmp = self.directory / ".acked.tmp"
        tmp.write_text(f"{self.acked}\n")
        tmp.replace(self.directory / "acked")

    def _load(self) -> None:
        for path in sorted(self.directory.glob("*.log")):
            first = last = None
            pending = 0
            start = None
            offset = 0
            with path.open("rb") as f:
                for line in f:
                    seq = _seq_of(line)
                    if seq is None or not line.endswith(b"\n"):
                        break  # a record cut short by a crash: the rest of the file is not trusted
                    if seq > self.acked:
                        pending += 1
                        if start is None:
                            start = offset
                    first = seq if first is None else first
                    last = seq
                    offset += len(line)
            if first is None or last is None or pending == 0 or start is None:
                path.unlink(missing_ok=True)
                continue
            if offset != path.stat().st_size:
                with path.open("r+b") as f:
                    f.truncate(offset)
            self.segments.append(_Segment(path, first, last, pending, offset, start))

    # -- the stream ------------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def pending(self) -> int:
        return sum(s.pending for s in self.segments)

    def append(self, lines: list[bytes]) -> None:
        for line in lines:
            if not self.segments or self._active is None or self.segments[-1].size >= self.segment_bytes:
                self._roll()
            segment = self.segments[-1]
            seq = self.next_seq
            self.next_seq += 1
            record = f"{seq}\t".encode() + line + b"\n"
            assert self._active is not None
            self._active.write(record)
            segment.last_seq = seq
            segment.pending += 1
            segment.size += len(record)

    def _roll(self) -> None:
        if self._active is not None:
            self._active.close()
        path = self.directory / f"{self.next_seq:020d}.log"
        # Unbuffered: each record is in the kernel once written, so a SIGKILLed agent loses none.
        self._active = path.open("ab", buffering=0)
        self.segments.append(_Segment(path, self.next_seq, self.next_seq - 1, 0, 0))

    def take(self, limit: int) -> tuple[list[bytes], _Taken | None]:
        """The oldest ``limit`` records not yet acknowledged (their JSON), and where they end."""
        out: list[bytes] = []
        taken: _Taken | None = None
        for segment in self.segments:
            if len(out) >= limit:
                break
            with segment.path.open("rb") as f:
                f.seek(segment.start)
                offset = segment.start
                for line in f:
                    if len(out) >= limit or not line.endswith(b"\n"):
                        break
                    seq = _seq_of(line)
                    offset += len(line)
                    if seq is None or seq <= self.acked:
                        continue
                    out.append(line.split(b"\t", 1)[1][:-1])
                    taken = _Taken(seq, segment.path, offset)
        return out, taken

    def commit(self, taken: _Taken) -> None:
        """The control plane has every record up to ``taken``: forget them."""
        if taken.last_seq <= self.acked:
            return
        self.acked = taken.last_seq
        while self.segments and self.segments[0].last_seq <= self.acked:
            segment = self.segments.pop(0)
            if not self.segments or segment is self.segments[-1]:
                self._close_active()
            segment.path.unlink(missing_ok=True)
        if self.segments and self.segments[0].path == taken.path:
            first = self.segments[0]
            # Records up to the offset are acknowledged; count what is left in the segment.
            first.pending = max(0, first.last_seq - taken.last_seq)
            first.start = taken.end
        if not self.segments:
            self._close_active()
        self._write_acked()

    def drop_oldest(self) -> int:
        """Drop the oldest segment (over the bound); how many unacknowledged records went with it."""
        if not self.segments:
            return 0
        segment = self.segments.pop(0)
        if not self.segments:
            self._close_active()
        segment.path.unlink(missing_ok=True)
        # Records of a dropped segment are never sent: count them as acknowledged so a take skips past them.
        self.acked = max(self.acked, segment.last_seq)
        self._write_acked()
        return segment.pending

    def sync(self) -> None:
        if self._active is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._active.fileno())

    def _close_active(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None

    def close(self) -> None:
        self._close_active()


def _seq_of(line: bytes) -> int | None:
    head, tab, _ = line.partition(b"\t")
    if not tab:
        return None
    try:
        return int(head)
    except ValueError:
        return None


@dataclass
class Batch:
    """What one heartbeat carries from the journal, and where each stream's part ended (for ``commit``)."""

    samples: list[schema.GpuSample]
    events: list[schema.AgentEvent]
    containers: list[schema.ContainerReport] = field(default_factory=list)
    buffered_events: int = 0  # how many of ``events`` came from the journal (the rest is the drop report)
    taken: dict[str, _Taken] = field(default_factory=dict)


class Journal:
    """The agent's durable outbox for heartbeats; see the module. Safe to append to from any thread."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_events: int = schema.MAX_EVENTS - 1,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        # One place in a heartbeat stays free for the event that reports drops.
        self.max_events = min(max_events, schema.MAX_EVENTS - 1)
        segment = max(MIN_SEGMENT_BYTES, min(MAX_SEGMENT_BYTES, max_bytes // 16))
        self._lock = threading.RLock()
        self._streams = {kind: _Stream(self.directory / kind, segment) for kind in (SAMPLES, EVENTS, CONTAINERS)}
        self.dropped: dict[str, int] = {SAMPLES: 0, EVENTS: 0, LOGS: 0}
        self._unreported: dict[str, int] = {SAMPLES: 0, EVENTS: 0, LOGS: 0}
        # The live-log shipper's bytes on disk, and how to make it drop the oldest of them (``attach_logs``).
        self._logs_size: Callable[[], int] = lambda: 0
        self._logs_trim: Callable[[int], int] = lambda want: 0

    def attach_logs(self, *, size: Callable[[], int], trim: Callable[[int], int]) -> None:
        """The log shipper keeps its unacknowledged output under ``logs/``: count it in the bound, and trim it."""
        with self._lock:
            self._logs_size, self._logs_trim = size, trim

    # -- adding ----------------------------------------------------------------------------------------------

    def add_samples(self, samples: list[schema.GpuSample]) -> None:
        self._add(SAMPLES, samples)

    def add_events(self, events: list[schema.AgentEvent]) -> None:
        self._add(EVENTS, events)

    def add_containers(self, reports: list[schema.ContainerReport]) -> None:
        """Container reports that say something new (a start, an exit): kept until the control plane has them."""
        self._add(CONTAINERS, reports)
        if reports:
            self.sync(CONTAINERS)  # the ground of usage: durable at once, not at the next sync

    def _add(self, kind: str, items: list[Any]) -> None:
        if not items:
            return
        lines = [item.model_dump_json().encode() for item in items]
        with self._lock:
            self._streams[kind].append(lines)
            self._bound()

    def enforce_bound(self) -> None:
        """Drop what is over the bound (the log shipper calls this after it wrote)."""
        with self._lock:
            self._bound()

    def _bound(self) -> None:
        for kind in DROP_ORDER:
            if kind == LOGS:
                over = self.size - self.max_bytes
                lost = self._logs_trim(over) if over > 0 else 0
                if lost:
                    self.dropped[LOGS] += lost
                    self._unreported[LOGS] += lost
                    log.warning("journal over %d bytes: dropped the oldest %d bytes of output", self.max_bytes, lost)
                continue
            stream = self._streams[kind]
            while self.size > self.max_bytes and stream.segments:
                lost = stream.drop_oldest()
                self.dropped[kind] += lost
                self._unreported[kind] += lost
                log.warning("journal over %d bytes: dropped the oldest %d %s", self.max_bytes, lost, kind)
            if self.size <= self.max_bytes:
                return

    # -- reading ---------------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return sum(stream.size for stream in self._streams.values()) + self._logs_size()

    def pending(self, kind: str) -> int:
        """Records of ``kind`` not yet acknowledged."""
        with self._lock:
            return self._streams[kind].pending

    def take(self, *, max_samples: int, now: datetime, max_containers: int = schema.MAX_CONTAINERS) -> Batch:
        """The oldest records of each kind, up to a heartbeat's worth, without removing them."""
        with self._lock:
            sample_lines, sample_end = self._streams[SAMPLES].take(max_samples)
            event_lines, event_end = self._streams[EVENTS].take(self.max_events)
            report_lines, report_end = self._streams[CONTAINERS].take(max_containers)
            unreported = dict(self._unreported)
        samples = [schema.GpuSample.model_validate_json(line) for line in sample_lines]
        events = [schema.AgentEvent.model_validate_json(line) for line in event_lines]
        reports = [schema.ContainerReport.model_validate_json(line) for line in report_lines]
        buffered = len(events)
        if any(unreported.values()):
            events.append(
                schema.AgentEvent(
                    kind="agent",
                    ts=now,
                    message=(
                        f"journal full while the control plane was unreachable: dropped the oldest "
                        f"{unreported[SAMPLES]} samples and {unreported[EVENTS]} events"
                        + (f" and {unreported[LOGS]} bytes of container output" if unreported[LOGS] else "")
                    ),
                )
            )
        taken = {k: v for k, v in ((SAMPLES, sample_end), (EVENTS, event_end), (CONTAINERS, report_end)) if v}
        return Batch(samples, events, reports, buffered_events=buffered, taken=taken)

    def commit(self, batch: Batch) -> None:
        """The control plane has ``batch`` (or would never accept it): forget what it carried."""
        with self._lock:
            for kind, taken in batch.taken.items():
                self._streams[kind].commit(taken)
            if len(batch.events) > batch.buffered_events:  # the drop report went out
                self._unreported = {kind: 0 for kind in self._unreported}

    def sync(self, *kinds: str) -> None:
        """Make what was written durable against a power loss too (a killed process loses nothing anyway)."""
        with self._lock:
            for kind in kinds or tuple(self._streams):
                self._streams[kind].sync()

    def close(self) -> None:
        with self._lock:
            for stream in self._streams.values():
                stream.close()
