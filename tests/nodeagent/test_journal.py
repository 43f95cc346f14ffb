"""The journal behind heartbeats: in order, in batches, bounded (samples dropped first, container reports never),
on disk across a restart, and each record replayed once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nodeagent import schema
from nodeagent.journal import CONTAINERS, EVENTS, SAMPLES, Journal

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
NODE = schema.NodeFacts(hostname="node-a", agent_version="0.1.0", backend="simulated", simulated=True)


def sample(i: int, uuid: str = "GPU-1") -> schema.GpuSample:
    return schema.GpuSample(uuid=uuid, ts=NOW + timedelta(seconds=i), fields={schema.GPU_UTIL: float(i)})


def report(launch: str, state: str = "exited", **fields) -> schema.ContainerReport:  # type: ignore[no-untyped-def]
    return schema.ContainerReport(launch_id=launch, reservation="r", state=state, **fields)  # type: ignore[arg-type]


def utils(batch) -> list[float]:  # type: ignore[no-untyped-def]
    return [s.fields[schema.GPU_UTIL] for s in batch.samples]


def test_take_hands_out_the_oldest_in_order_and_only_commit_removes(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add_samples([sample(i) for i in range(10)])
    journal.add_events([schema.AgentEvent(kind="xid", ts=NOW, xid=x) for x in (1, 2)])
    first = journal.take(max_samples=4, now=NOW)
    assert utils(first) == [0, 1, 2, 3] and [e.xid for e in first.events] == [1, 2]
    assert utils(journal.take(max_samples=4, now=NOW)) == [0, 1, 2, 3]  # a failed send commits nothing
    journal.commit(first)
    second = journal.take(max_samples=100, now=NOW)
    assert utils(second) == list(range(4, 10)) and second.events == []
    journal.add_samples([sample(10)])  # arrives while the batch is out: stays for the next
    journal.commit(second)
    assert utils(journal.take(max_samples=100, now=NOW)) == [10]


def test_what_was_written_survives_a_restart_and_what_was_committed_is_not_replayed(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add_samples([sample(i) for i in range(6)])
    journal.add_containers([report("launch-1", started_at=NOW, finished_at=NOW + timedelta(seconds=90))])
    journal.commit(journal.take(max_samples=2, now=NOW))
    journal.add_events([schema.AgentEvent(kind="agent", ts=NOW, message="fenced")])

    again = Journal(tmp_path)  # a new process on the same state directory
    batch = again.take(max_samples=100, now=NOW)
    assert utils(batch) == [2, 3, 4, 5] and [e.message for e in batch.events] == ["fenced"]
    assert batch.containers == []  # went out with the first batch
    again.commit(batch)
    assert Journal(tmp_path).take(max_samples=100, now=NOW).samples == []


def test_a_record_cut_short_by_a_crash_is_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add_samples([sample(i) for i in range(3)])
    journal.close()
    [segment] = (tmp_path / SAMPLES).glob("*.log")
    with segment.open("ab") as f:
        f.write(b'4\t{"uuid": "GPU-1", "ts": "2026-')  # the power went mid-write
    again = Journal(tmp_path)
    assert utils(again.take(max_samples=100, now=NOW)) == [0, 1, 2]
    again.add_samples([sample(3)])
    assert utils(again.take(max_samples=100, now=NOW)) == [0, 1, 2, 3]


def test_a_sigkilled_writer_loses_nothing_it_wrote(tmp_path: Path) -> None:
    # Each record is in the kernel once add_* returns (unbuffered writes): a SIGKILL right after loses none.
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_journal import sample, report
        from nodeagent.journal import Journal
        j = Journal({str(tmp_path)!r})
        j.add_samples([sample(i) for i in range(50)])
        j.add_containers([report("launch-1")])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], check=False)
    assert done.returncode == -signal.SIGKILL
    batch = Journal(tmp_path).take(max_samples=100, now=NOW)
    assert utils(batch) == list(range(50)) and [r.launch_id for r in batch.containers] == ["launch-1"]


def test_over_the_bound_the_oldest_samples_go_first_and_container_reports_never(tmp_path: Path) -> None:
    journal = Journal(tmp_path, max_bytes=64 * 1024)  # segments of 4 KiB
    reports = [report(f"launch-{i}", started_at=NOW, finished_at=NOW + timedelta(hours=1)) for i in range(40)]
    journal.add_containers(reports[:20])
    journal.add_events([schema.AgentEvent(kind="agent", ts=NOW, message=f"e{i}") for i in range(20)])
    journal.add_samples([sample(i) for i in range(2000)])
    journal.add_containers(reports[20:])
    assert journal.size <= 64 * 1024
    dropped = journal.dropped[SAMPLES]
    assert dropped > 0 and journal.dropped[EVENTS] == 0
    batch = journal.take(max_samples=5000, now=NOW)
    assert utils(batch) == list(range(dropped, 2000))  # the newest, in order
    assert [r.launch_id for r in batch.containers] == [r.launch_id for r in reports]  # every one
    assert len(batch.events) == 21 and f"dropped the oldest {dropped} samples and 0 events" in batch.events[-1].message
    journal.commit(batch)
    assert journal.take(max_samples=10, now=NOW).events == []  # the drop is reported once
    assert journal.dropped[SAMPLES] == dropped  # the total stays


def test_with_no_samples_left_to_drop_events_go_next(tmp_path: Path) -> None:
    journal = Journal(tmp_path, max_bytes=64 * 1024)
    journal.add_events([schema.AgentEvent(kind="agent", ts=NOW, message="x" * 500) for _ in range(400)])
    assert journal.dropped[EVENTS] > 0 and journal.size <= 64 * 1024
    assert journal.pending(CONTAINERS) == 0


def test_a_batch_never_overflows_a_heartbeat_with_the_drop_report(tmp_path: Path) -> None:
    journal = Journal(tmp_path, max_bytes=256 * 1024)
    journal.add_events([schema.AgentEvent(kind="agent", ts=NOW, message="y" * 300) for _ in range(schema.MAX_EVENTS)])
    batch = journal.take(max_samples=10, now=NOW)
    assert len(batch.events) <= schema.MAX_EVENTS
    schema.Heartbeat(seq=1, sent_at=NOW, node=NODE, gpus=[], events=batch.events)


def test_records_dropped_while_a_batch_was_out_are_not_sent_again(tmp_path: Path) -> None:
    journal = Journal(tmp_path, max_bytes=64 * 1024)
    journal.add_samples([sample(i) for i in range(100)])
    batch = journal.take(max_samples=50, now=NOW)
    journal.add_samples([sample(i) for i in range(100, 3000)])  # the bound drops the segment the batch came from
    journal.commit(batch)
    rest = utils(journal.take(max_samples=5000, now=NOW))
    assert rest == sorted(rest) and rest[0] >= 50 and rest[-1] == 2999
    assert not os.listdir(tmp_path / CONTAINERS) or journal.pending(CONTAINERS) == 0


def test_container_output_is_trimmed_after_the_samples_and_before_the_events(tmp_path: Path) -> None:
    held = {"bytes": 0}

    def trim(want: int) -> int:
        gone = min(want, held["bytes"])
        held["bytes"] -= gone
        return gone

    journal = Journal(tmp_path, max_bytes=64 * 1024)
    journal.attach_logs(size=lambda: held["bytes"], trim=trim)
    journal.add_events([schema.AgentEvent(kind="agent", ts=NOW, message="e") for _ in range(10)])
    journal.add_samples([sample(i) for i in range(100)])
    held["bytes"] = 60 * 1024  # the log shipper wrote a lot of output
    journal.enforce_bound()
    dropped = journal.dropped[SAMPLES]
    assert dropped > 0 and journal.pending(SAMPLES) == 100 - dropped  # the oldest samples went first
    assert journal.size <= 64 * 1024 and held["bytes"] == 60 * 1024  # which was enough
    held["bytes"] = 70 * 1024
    journal.enforce_bound()
    assert journal.pending(SAMPLES) == 0 and journal.dropped[SAMPLES] == 100  # then the rest of them
    assert held["bytes"] < 64 * 1024 and journal.dropped["logs"] > 0 and journal.dropped[EVENTS] == 0
    message = journal.take(max_samples=10, now=NOW).events[-1].message
    assert "dropped the oldest 100 samples and 0 events and" in message and "bytes of container output" in message
