"""DCGM's profiling fields (SM active, tensor pipe active, DRAM active): through NVML's GPM API on a GPU that has
it (a fake pynvml), null where it does not, simulated plausibly, and validated on the wire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pynvml
import pytest
from nvml_fakes import FakeGpu, FakeNvml
from pydantic import ValidationError

from nodeagent import schema
from nodeagent.backends.nvml import NvmlBackend
from nodeagent.backends.simulated import SimulatedBackend

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
HOPPER = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: 62.5,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 31.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 44.25,
}
PROF = schema.PROFILING_FIELDS


def gpu(**kwargs) -> FakeGpu:  # type: ignore[no-untyped-def]
    return FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001", bus_id="00000000:18:00.0", **kwargs)


def fields(backend: NvmlBackend, at: datetime = NOW) -> dict[str, float | None]:
    [sample] = backend.sample(at)
    return sample.fields


def test_a_hopper_reports_the_profiling_fields_as_ratios_from_its_second_reading():
    g = gpu(gpm=dict(HOPPER))
    backend = NvmlBackend(nvml=FakeNvml([g]))
    first = fields(backend)
    # One GPM sample is half a pair: no metric yet, and the rest of the sample is there.
    assert [first[name] for name in PROF] == [None, None, None] and first[schema.GPU_UTIL] == 42.0
    second = fields(backend, NOW + timedelta(seconds=1))
    assert second[schema.PROF_SM_ACTIVE] == 0.625
    assert second[schema.PROF_PIPE_TENSOR_ACTIVE] == 0.31
    assert second[schema.PROF_DRAM_ACTIVE] == 0.4425
    fields(backend, NOW + timedelta(seconds=2))
    # Each reading pairs the previous sample with a new one and frees the previous: only the newest is held.
    assert (g.gpm_samples, g.gpm_freed) == (3, 2)
    backend.close()
    assert g.gpm_freed == 3


def test_a_gpu_without_gpm_reports_null_and_is_not_asked_again():
    g = gpu(gpm=None)
    fake = FakeNvml([g])
    backend = NvmlBackend(nvml=fake)
    for i in range(3):
        f = fields(backend, NOW + timedelta(seconds=i))
        assert [f[name] for name in PROF] == [None, None, None]
        assert f[schema.POWER_USAGE] == pytest.approx(312.456)
    assert fake.calls.count("nvmlGpmQueryDeviceSupport") == 1 and g.gpm_samples == 0
    assert set(PROF) <= backend.unsupported[g.uuid]


def test_not_supported_from_the_driver_makes_the_fields_null_not_the_sample():
    g = gpu(gpm=dict(HOPPER), unsupported={"nvmlGpmSampleGet"})
    backend = NvmlBackend(nvml=FakeNvml([g]))
    for i in range(2):
        f = fields(backend, NOW + timedelta(seconds=i))
        assert [f[name] for name in PROF] == [None, None, None] and f[schema.GPU_TEMP] == 51.0


def test_a_metric_the_gpu_lacks_is_null_beside_those_it_has():
    g = gpu(gpm={pynvml.NVML_GPM_METRIC_SM_UTIL: 80.0})
    backend = NvmlBackend(nvml=FakeNvml([g]))
    fields(backend)
    f = fields(backend, NOW + timedelta(seconds=1))
    assert [f[name] for name in PROF] == [0.8, None, None]


def test_a_pynvml_without_the_gpm_api_reports_null():
    g = gpu(gpm=dict(HOPPER))
    backend = NvmlBackend(nvml=FakeNvml([g], missing=("nvmlGpmMetricsGet",)))
    for i in range(2):
        f = fields(backend, NOW + timedelta(seconds=i))
        assert [f[name] for name in PROF] == [None, None, None]


def test_a_gpu_lost_in_the_gpm_call_drops_its_sample_only():
    good, bad = gpu(gpm=dict(HOPPER)), FakeGpu(uuid="GPU-bbbb", bus_id="00000000:2A:00.0", gpm=dict(HOPPER))
    fake = FakeNvml([good, bad])
    backend = NvmlBackend(nvml=fake)
    backend.sample(NOW)
    sample_get = fake.nvmlGpmSampleGet

    def lost_on_bad(handle, sample):  # type: ignore[no-untyped-def]
        if handle is bad:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return sample_get(handle, sample)

    fake.nvmlGpmSampleGet = lost_on_bad  # type: ignore[method-assign]
    samples = backend.sample(NOW + timedelta(seconds=1))
    assert [s.uuid for s in samples] == [good.uuid]
    assert samples[0].fields[schema.PROF_SM_ACTIVE] == 0.625


def test_simulated_profiling_tracks_load_with_tensor_and_dram_under_sm():
    busy: set[str] = set()
    backend = SimulatedBackend(spec="2xH100-80GB", hostname="sim-1", busy_source=lambda: busy, seed=7)
    [a, _b] = backend.discover()
    busy.add(a.uuid)
    for i in range(10):
        samples = {s.uuid: s.fields for s in backend.sample(NOW + timedelta(seconds=i))}
    hot, cold = samples[a.uuid], samples[_b.uuid]
    assert hot[schema.PROF_SM_ACTIVE] > 0.6 and cold[schema.PROF_SM_ACTIVE] < 0.05
    assert hot[schema.PROF_SM_ACTIVE] <= hot[schema.GPU_UTIL] / 100
    assert 0 < hot[schema.PROF_PIPE_TENSOR_ACTIVE] < hot[schema.PROF_SM_ACTIVE]
    assert 0 < hot[schema.PROF_DRAM_ACTIVE] < hot[schema.PROF_SM_ACTIVE]


def test_the_wire_refuses_a_ratio_out_of_range_naming_the_reading():
    ok = schema.GpuSeries(uuid="GPU-1", ts=[1.0, 2.0], fields={schema.PROF_SM_ACTIVE: [0.5, None]})
    assert ok.fields[schema.PROF_SM_ACTIVE] == [0.5, None]
    body = {
        "schema_version": 2,
        "seq": 1,
        "sent_at": "2026-05-01T12:00:00Z",
        "node": {"hostname": "n1", "agent_version": "1", "backend": "simulated", "simulated": True},
        "gpus": [],
        "samples": [{"uuid": "GPU-1", "ts": [1.0, 2.0], "fields": {schema.PROF_PIPE_TENSOR_ACTIVE: [0.2, 42.0]}}],
    }
    import json

    with pytest.raises(ValidationError) as refused:
        schema.parse_heartbeat(json.dumps(body))
    assert list(schema.error_fields(refused.value)) == [f"samples.0.fields.{schema.PROF_PIPE_TENSOR_ACTIVE}.1"]
    with pytest.raises(ValidationError) as refused_v1:
        schema.GpuSample(uuid="GPU-1", ts=NOW, fields={schema.PROF_DRAM_ACTIVE: -0.1})
    assert list(schema.error_fields(refused_v1.value)) == [f"fields.{schema.PROF_DRAM_ACTIVE}"]
