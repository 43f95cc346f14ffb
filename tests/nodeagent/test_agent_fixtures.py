"""Recorded ``nodeagent probe --json`` output (tests/fixtures/nvml/*.json) still validates against the schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent import schema
from nodeagent.probe import ProbeReport

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "nvml").glob("*.json"))


def test_there_is_at_least_one_recording_including_a_simulated_example():
    reports = [ProbeReport.model_validate_json(path.read_text()) for path in FIXTURES]
    assert any(r.simulated for r in reports), "ship the simulated example beside any real recording"


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_recording_is_a_valid_probe_report(path: Path):
    report = ProbeReport.model_validate_json(path.read_text())
    assert report.schema_version == schema.SCHEMA_VERSION
    assert report.node.simulated == report.simulated
    assert report.node.backend == ("simulated" if report.simulated else "nvml")
    uuids = {g.uuid for g in report.gpus}
    assert len(uuids) == len(report.gpus) > 0
    assert sorted(g.index for g in report.gpus) == list(range(len(report.gpus)))
    assert {s.uuid for s in report.samples} == uuids
    for gpu in report.gpus:
        assert set(gpu.nvlink_peers) <= uuids - {gpu.uuid}
        assert gpu.memory_total_mib > 0
    for sample in report.samples:
        assert set(sample.fields) <= set(schema.SAMPLE_FIELDS)
        # The wire format is what the control plane ingests: each sample must pass as part of a heartbeat.
    for version, samples in ((schema.HeartbeatV1, report.samples), (schema.Heartbeat, None)):
        heartbeat = version(
            seq=1,
            sent_at=report.recorded_at,
            node=report.node,
            gpus=report.gpus,
            samples=samples if samples is not None else schema.series_from_samples(report.samples),
            events=report.events,
        )
        # As the control plane reads it: from the JSON the agent sends.
        assert schema.parse_heartbeat(heartbeat.model_dump_json()) == heartbeat


def test_a_real_recording_names_its_driver_and_what_it_could_not_read():
    real = [r for r in (ProbeReport.model_validate_json(p.read_text()) for p in FIXTURES) if not r.simulated]
    if not real:
        pytest.skip("no recording from real hardware yet: record one with `nodeagent probe --json` on a GPU server")
    for report in real:
        assert report.node.driver_version and report.node.driver_version != "simulated"
        for sample in report.samples:
            nulls = {k for k, v in sample.fields.items() if v is None}
            assert nulls <= set(report.unavailable_fields.get(sample.uuid, [])) | {schema.XID_ERRORS}
