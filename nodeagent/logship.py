"""Live logs: follow every container of this node and ship its output to the control plane as it comes.

One reader thread per container (the Docker SDK's ``logs(stream=True, follow=True)``: stdout and stderr as
Docker interleaves them) counts byte offsets from the start of the container's output; one shipping thread
posts ``schema.LogBatch`` to the control plane, at most every ``interval_s`` while there is new output.

The control plane is the record of what arrived: its reply gives, per launch, the offset it expects next,
and the shipper goes on from there: it drops what the control plane already has (a restarted agent reads
each log from the start again and duplicates nothing) and resends what it lacks. A new launch is first
asked for (an empty chunk) before anything is sent. ``eof`` goes out once the container has exited and all of
its output was read and acknowledged.

What was read and not yet acknowledged waits in the agent's journal (``journal``: one file per launch under
``<journal>/logs``), so a control-plane outage costs nothing up to the journal's bound, and a restarted agent
still ships the output of a container that was removed meanwhile. Over the bound, the oldest bytes of the launch
holding the most go (after the GPU samples, nodeagent.journal), and the control plane records the hole. Without a
journal each launch keeps at most ``max_pending_bytes`` in memory.

Output a container wrote while no agent followed it, and that the runtime removed with the container after
its exit, is lost: the runtime does not wait for the shipper (while fenced, it removes nothing).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodeagent import schema
from nodeagent.client import ControlPlaneClient, CredentialRevoked, Rejected, Unreachable
from nodeagent.runtime.containers import LABEL_LAUNCH, LABEL_NODE, safe_id

if TYPE_CHECKING:
    from nodeagent.journal import Journal

log = logging.getLogger(__name__)

MAX_PENDING_BYTES = 1024 * 1024
MAX_BATCH_BYTES = 512 * 1024  # under the control plane's body limit once in base64 and JSON
_LIVE = frozenset({"running", "paused", "restarting"})


class _MemoryPending:
    """Bytes read and not yet acknowledged, in memory (no journal)."""

    def __init__(self) -> None:
        self._data = bytearray()

    def __len__(self) -> int:
        return len(self._data)

    def extend(self, data: bytes) -> None:
        self._data += data

    def drop(self, n: int) -> None:
        del self._data[:n]

    def slice(self, index: int, n: int) -> bytes:
        return bytes(self._data[index : index + n])

    def remove(self) -> None:
        self._data.clear()


class _FilePending:
    """Bytes read and not yet acknowledged, in the journal: ``<safe id>.out`` holds the output from the offset
    ``file_start`` on, of which the first ``skip`` bytes are acknowledged (or dropped); ``<safe id>.json`` says so.
    Written straight to the kernel, so a killed agent loses none of it."""

    COMPACT_BYTES = 1024 * 1024

    def __init__(self, directory: Path, launch_id: str, *, file_start: int = 0, skip: int = 0) -> None:
        self.launch_id = launch_id
        self.data_path = directory / f"{safe_id(launch_id)}.out"
        self.meta_path = directory / f"{safe_id(launch_id)}.json"
        self.file_start, self.skip = file_start, skip
        self._file = self.data_path.open("a+b", buffering=0)
        self.size = self._file.seek(0, os.SEEK_END)
        self._save()

    @classmethod
    def restore(cls, meta_path: Path) -> _FilePending | None:
        try:
            meta = json.loads(meta_path.read_text())
            return cls(meta_path.parent, str(meta["launch_id"]), file_start=int(meta["start"]), skip=int(meta["skip"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def end(self) -> int:
        """The offset after the last byte held."""
        return self.file_start + self.size

    def __len__(self) -> int:
        return self.size - self.skip

    def extend(self, data: bytes) -> None:
        self._file.write(data)
        self.size += len(data)

    def drop(self, n: int) -> None:
        self.skip += min(n, len(self))
        if self.skip == self.size:
            self._file.truncate(0)
            self.file_start, self.skip, self.size = self.file_start + self.size, 0, 0
        elif self.skip >= self.COMPACT_BYTES and self.skip * 2 >= self.size:
            rest = self.slice(0, len(self))
            tmp = self.data_path.with_suffix(".tmp")
            tmp.write_bytes(rest)
            tmp.replace(self.data_path)
            self._file.close()
            self._file = self.data_path.open("a+b", buffering=0)
            self.file_start, self.skip, self.size = self.file_start + self.skip, 0, len(rest)
        self._save()

    def slice(self, index: int, n: int) -> bytes:
        return os.pread(self._file.fileno(), max(0, min(n, len(self) - index)), self.skip + index)

    def remove(self) -> None:
        self._file.close()
        self.data_path.unlink(missing_ok=True)
        self.meta_path.unlink(missing_ok=True)

    def _save(self) -> None:
        tmp = self.meta_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"launch_id": self.launch_id, "start": self.file_start, "skip": self.skip}))
        tmp.replace(self.meta_path)


@dataclass
class _Follow:
    """One launch's output as read from Docker and not yet acknowledged by the control plane."""

    launch_id: str
    container: Any
    pending: _MemoryPending | _FilePending = field(default_factory=_MemoryPending)
    read: int = 0  # bytes read from the container's output: the offset of the next one
    acked: int | None = None  # the offset the control plane expects next, once it said
    done: bool = False  # the container exited and all its output was read
    refused: bool = False  # the control plane knows no such launch of this node
    dropped: int = 0  # bytes dropped since the last report of it
    stream: Any = None

    @property
    def start(self) -> int:
        """The offset of ``pending[0]``."""
        return self.read - len(self.pending)


@dataclass
class _Sent:
    follow: _Follow
    end: int
    eof: bool


class LogShipper:
    """Follows the containers labelled ``gpucp.node=<node>`` and ``gpucp.launch_id``; see the module.

    ``credential`` returns the node credential, or None before enrollment (output is held meanwhile).
    ``client`` should be this shipper's own: a requests session is not shared between threads.
    """

    def __init__(
        self,
        *,
        client: ControlPlaneClient,
        credential: Callable[[], str | None],
        docker_client: Any,
        node: str,
        interval_s: float = 0.25,
        scan_interval_s: float = 1.0,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        timeout_s: float = 5.0,
        journal: Journal | None = None,
    ) -> None:
        self.client = client
        self.credential = credential
        self.docker = docker_client
        self.node = node
        self.interval_s = interval_s
        self.scan_interval_s = scan_interval_s
        self.max_pending_bytes = max_pending_bytes
        self.max_batch_bytes = min(max_batch_bytes, schema.MAX_LOG_CHUNKS * schema.MAX_LOG_CHUNK_BYTES)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._follows: dict[str, _Follow] = {}
        self._finished: set[str] = set()  # launch ids whose output is all acknowledged
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        # With the agent's journal, what is not acknowledged waits on disk, under the journal's bound.
        self.journal = journal
        self.spill_dir: Path | None = None
        if journal is not None:
            self.spill_dir = journal.directory / "logs"
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            self._restore()
            journal.attach_logs(size=self._spill_size, trim=self._spill_trim)
        # Launches restored from the journal that the first scan must find in the engine, or they are done.
        self._unscanned = {f.launch_id for f in self._follows.values()}

    # -- lifecycle -----------------------------------------------------------------------------------------

    def _restore(self) -> None:
        """Output read by a previous agent and not acknowledged: shipped again, whether or not its container is
        still there (the reader of one that is reads it again from the start and keeps only what is new)."""
        assert self.spill_dir is not None
        for meta in sorted(self.spill_dir.glob("*.json")):
            pending = _FilePending.restore(meta)
            if pending is None:
                continue
            follow = _Follow(launch_id=pending.launch_id, container=None, pending=pending, read=pending.end)
            self._follows[follow.launch_id] = follow

    def _new_pending(self, launch_id: str) -> _MemoryPending | _FilePending:
        if self.spill_dir is None:
            return _MemoryPending()
        # Anything left under this name without a readable record of its offsets cannot be placed: start afresh.
        (self.spill_dir / f"{safe_id(launch_id)}.out").unlink(missing_ok=True)
        return _FilePending(self.spill_dir, launch_id)

    def _spill_size(self) -> int:
        with self._lock:
            return sum(len(f.pending) for f in self._follows.values())

    def _spill_trim(self, want: int) -> int:
        """The journal is over its bound: drop at least ``want`` of the oldest bytes held, from the launches that
        hold the most; how many went."""
        gone = 0
        with self._lock:
            while gone < want:
                holders = [f for f in self._follows.values() if len(f.pending)]
                if not holders:
                    break
                follow = max(holders, key=lambda f: len(f.pending))
                n = min(len(follow.pending), want - gone)
                follow.pending.drop(n)
                follow.dropped += n
                gone += n
        return gone

    def start(self) -> LogShipper:
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            streams = [f.stream for f in self._follows.values() if f.stream is not None]
        for stream in streams:
            with contextlib.suppress(Exception):  # a broken stream may fail to close in any way; it is closed then
                stream.close()  # unblocks its reader
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        next_scan = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_scan:
                try:
                    self._scan()
                except Exception as exc:  # the engine may be restarting; the next scan retries
                    log.warning("cannot list containers for live logs: %s", exc)
                next_scan = now + self.scan_interval_s
            self._wake.clear()
            credential = self.credential()
            batch = self._batch() if credential else None
            if batch is None:
                self._wake.wait(max(0.0, next_scan - time.monotonic()))
                continue
            wait = self._post(credential or "", batch[0], batch[1])
            # A full batch means a backlog: the rest goes at once. Otherwise at most one batch per interval.
            self._stop.wait(0.0 if batch[2] and wait == self.interval_s else wait)

    # -- following -----------------------------------------------------------------------------------------

    def _scan(self) -> None:
        # Sparse: the list's own fields (labels, state) suffice; a full one would inspect every container each time.
        containers = self.docker.containers.list(
            all=True, sparse=True, filters={"label": [LABEL_LAUNCH, f"{LABEL_NODE}={self.node}"]}
        )
        present: set[str] = set()
        for container in containers:
            launch_id = (container.attrs.get("Labels") or {}).get(LABEL_LAUNCH)
            if not launch_id:
                continue
            present.add(launch_id)
            with self._lock:
                restored = self._follows.get(launch_id)
                if restored is not None and restored.container is None and container.status != "created":
                    restored.container = container  # restored from the journal: read it again, keep what is new
                    follow = restored
                elif launch_id in self._follows or launch_id in self._finished:
                    continue
                # Not started yet: a follow would end at once, and the output would look complete.
                elif container.status == "created":
                    continue
                else:
                    follow = self._follows[launch_id] = _Follow(
                        launch_id=launch_id, container=container, pending=self._new_pending(launch_id)
                    )
            threading.Thread(target=self._read, args=(follow,), name=f"logs-{launch_id[:8]}", daemon=True).start()
        with self._lock:
            self._finished &= present  # gone from the engine: never seen again
            for launch_id in self._unscanned - present:
                # Restored from the journal, its container is gone: what the journal holds is all there is.
                if launch_id in self._follows and self._follows[launch_id].container is None:
                    self._follows[launch_id].done = True
            self._unscanned = set()

    def _read(self, follow: _Follow) -> None:
        container = follow.container
        while not self._stop.is_set():
            live = container.status in _LIVE
            broken = False
            try:
                stream = container.logs(stdout=True, stderr=True, stream=True, follow=live)
                follow.stream = stream
                position = 0
                for data in stream:
                    self._received(follow, position, data)
                    position += len(data)
            except Exception as exc:  # the engine, the socket or a removal; decided below
                broken = True
                if not self._stop.is_set():
                    log.debug("log stream of %s broke: %s", follow.launch_id, exc)
            finally:
                follow.stream = None
            if self._stop.is_set():
                return
            try:
                container.reload()
            except Exception:  # removed (NotFound) or the engine is gone: what was read is all
                break
            if container.status not in _LIVE and not broken:
                break  # a follow ends when the container exits: the whole output was read
            # The stream broke while the container runs: read it again from the start, keeping only what is new.
            self._stop.wait(1.0)
        with self._lock:
            follow.done = True
        self._wake.set()

    def _received(self, follow: _Follow, position: int, data: bytes) -> None:
        end = position + len(data)
        with self._lock:
            if end <= follow.read:
                return  # re-reading after a broken stream: had it already
            follow.pending.extend(data[follow.read - position :])
            follow.read = end
            self._trim(follow)
        if self.journal is not None:
            self.journal.enforce_bound()  # not under our lock: the journal may ask us to trim
        self._wake.set()

    def _trim(self, follow: _Follow) -> None:
        """Drop what the control plane has, and the oldest bytes past the per-launch limit."""
        if follow.refused:
            follow.pending.drop(len(follow.pending))
            return
        acked = follow.acked or 0
        # With the journal, its bound applies (``_spill_trim``); in memory, each launch's own.
        floor = acked if self.journal is not None else max(acked, follow.read - self.max_pending_bytes)
        if floor > follow.start:
            drop = min(len(follow.pending), floor - follow.start)
            lost = max(0, floor - max(acked, follow.start))  # not the acknowledged part: never sent
            follow.pending.drop(drop)
            if lost:
                follow.dropped += lost

    # -- shipping ------------------------------------------------------------------------------------------

    def _batch(self) -> tuple[schema.LogBatch, list[_Sent], bool] | None:
        """The next batch, what it carries of each launch, and whether it is full (more is waiting)."""
        chunks: list[schema.LogChunk] = []
        sent: list[_Sent] = []
        budget = self.max_batch_bytes
        with self._lock:
            for follow in list(self._follows.values()):
                if follow.refused or len(chunks) >= schema.MAX_LOG_CHUNKS:
                    continue
                if follow.acked is None:
                    # First ask where the control plane is, so a restarted agent resends nothing it has.
                    chunks.append(schema.LogChunk(launch_id=follow.launch_id, offset=0, data=""))
                    sent.append(_Sent(follow, 0, False))
                    continue
                at = follow.start
                if not follow.pending and follow.done:
                    chunks.append(schema.LogChunk(launch_id=follow.launch_id, offset=at, data="", eof=True))
                    sent.append(_Sent(follow, at, True))
                    continue
                index = 0
                while index < len(follow.pending) and budget > 0 and len(chunks) < schema.MAX_LOG_CHUNKS:
                    piece = follow.pending.slice(index, min(budget, schema.MAX_LOG_CHUNK_BYTES))
                    end = at + index + len(piece)
                    eof = follow.done and end == follow.read
                    chunks.append(
                        schema.LogChunk(
                            launch_id=follow.launch_id,
                            offset=at + index,
                            data=base64.b64encode(piece).decode("ascii"),
                            eof=eof,
                        )
                    )
                    sent.append(_Sent(follow, end, eof))
                    index += len(piece)
                    budget -= len(piece)
                if follow.dropped:
                    log.warning(
                        "live logs of %s: dropped the oldest %d bytes while the control plane was unreachable",
                        follow.launch_id,
                        follow.dropped,
                    )
                    follow.dropped = 0
        if not chunks:
            return None
        return schema.LogBatch(chunks=chunks), sent, budget <= 0 or len(chunks) >= schema.MAX_LOG_CHUNKS

    def _post(self, credential: str, batch: schema.LogBatch, sent: list[_Sent]) -> float:
        """Send one batch and apply the reply; the seconds to wait before the next."""
        try:
            reply = self.client.post_logs(credential, batch, timeout=(min(2.0, self.timeout_s), self.timeout_s))
        except CredentialRevoked:
            return 5.0  # the agent's heartbeat says what to do about it
        except Rejected as exc:
            if exc.status == 413:
                self.max_batch_bytes = max(16 * 1024, self.max_batch_bytes // 2)
                return 0.0
            # It would never be accepted: skip past it rather than send it forever.
            log.error("the control plane refused live logs (%s); skipping that output", exc)
            with self._lock:
                for item in sent:
                    item.follow.acked = max(item.follow.acked or 0, item.end)
                    self._trim(item.follow)
                    if item.eof:
                        self._finish(item.follow)
            return self.interval_s
        except Unreachable as exc:
            self._failures += 1
            if self._failures == 1:
                log.warning("cannot ship live logs: %s", exc)
            return min(5.0, self.interval_s * 2 ** min(self._failures, 5))
        self._failures = 0
        with self._lock:
            for item in sent:
                follow = item.follow
                expected = reply.next_offsets.get(follow.launch_id)
                if expected is None:
                    if not follow.refused:
                        log.warning(
                            "the control plane knows no launch %s of this node; not shipping it", follow.launch_id
                        )
                    follow.refused = True
                elif item.eof and expected >= item.end:
                    self._finish(follow)
                else:
                    follow.acked = expected
                self._trim(follow)
        return self.interval_s

    def _finish(self, follow: _Follow) -> None:
        self._follows.pop(follow.launch_id, None)
        self._finished.add(follow.launch_id)
        follow.pending.remove()

    def status(self) -> dict[str, dict[str, int | None]]:
        """Per followed launch: bytes read, acknowledged and pending (for tests and debugging)."""
        with self._lock:
            return {
                f.launch_id: {"read": f.read, "acked": f.acked, "pending": len(f.pending)}
                for f in self._follows.values()
            }
