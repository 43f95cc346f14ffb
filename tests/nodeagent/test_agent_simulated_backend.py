"""The simulated fleet: spec parsing, stable identities, topology, plausible telemetry and injected faults."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from nodeagent import schema
from nodeagent.backends.base import GpuBackend
from nodeagent.backends.simulated import CATALOG, SimulatedBackend, SimulatedSpecError, parse_spec
from nodeagent.collectors import GpuCollector

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def run(backend: SimulatedBackend, seconds: int, *, start: datetime = T0) -> list[list[schema.GpuSample]]:
    return [backend.sample(start + timedelta(seconds=s)) for s in range(seconds)]


@pytest.mark.parametrize(
    ("spec", "count", "name", "memory"),
    [
        ("8xH100-80GB", 8, "NVIDIA H100 80GB HBM3", 81559),
        ("4xA100-40GB", 4, "NVIDIA A100-SXM4-40GB", 40960),
        ("2xh200-141gb", 2, "NVIDIA H200", 143771),
        ("L40S", 1, "NVIDIA L40S", 46068),
        (" 4 x A100-80GB ", 4, "NVIDIA A100-SXM4-80GB", 81920),
    ],
)
def test_spec_declares_count_and_model(spec: str, count: int, name: str, memory: int):
    parsed = parse_spec(spec)
    assert parsed.count == count
    assert (parsed.model.product_name, parsed.model.memory_mib) == (name, memory)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "is not COUNTxMODEL"),
        ("eight H100", "is not COUNTxMODEL"),
        ("0xH100-80GB", "between 1 and 64, got 0"),
        ("65xH100-80GB", "between 1 and 64, got 65"),
        ("8xH900", "unknown GPU model 'H900'; known: H100-80GB"),
    ],
)
def test_bad_spec_is_refused_naming_what_was_wrong(spec: str, says: str):
    with pytest.raises(SimulatedSpecError, match=says.replace("(", r"\(")):
        parse_spec(spec)


def test_simulated_backend_is_labelled_simulated():
    backend = SimulatedBackend("2xH100-80GB", hostname="sim-1")
    assert isinstance(backend, GpuBackend)
    assert (backend.name, backend.simulated, backend.driver_version) == ("simulated", True, "simulated")


def test_uuids_are_stable_per_hostname_and_index_and_differ_between_hosts():
    a1 = [g.uuid for g in SimulatedBackend("8xH100-80GB", hostname="node-a").discover()]
    a2 = [g.uuid for g in SimulatedBackend("8xH100-80GB", hostname="node-a").discover()]
    b = [g.uuid for g in SimulatedBackend("8xH100-80GB", hostname="node-b").discover()]
    assert a1 == a2
    assert len(set(a1)) == 8 and not set(a1) & set(b)
    assert all(u.startswith("GPU-") for u in a1)


def test_an_8_gpu_h100_box_is_one_nvlink_group_split_over_two_numa_nodes():
    facts = SimulatedBackend("8xH100-80GB", hostname="node-a").discover()
    uuids = {g.uuid for g in facts}
    for gpu in facts:
        assert set(gpu.nvlink_peers) == uuids - {gpu.uuid}
    assert [g.numa_node for g in facts] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({g.pci_bus_id for g in facts}) == 8
    assert [g.index for g in facts] == list(range(8))


def test_pcie_cards_have_no_nvlink_peers():
    assert all(g.nvlink_peers == [] for g in SimulatedBackend("4xL40S", hostname="n").discover())


def test_telemetry_is_plausible_energy_monotone_power_within_tdp():
    backend = SimulatedBackend("8xH100-80GB", hostname="node-a", seed=7)
    tdp = CATALOG["H100-80GB"].tdp_w
    series = run(backend, 120)
    for index in range(8):
        gpu = [tick[index].fields for tick in series]
        energy = [f[schema.TOTAL_ENERGY] for f in gpu]
        assert energy == sorted(energy) and energy[-1] > energy[0]
        assert all(0 < f[schema.POWER_USAGE] <= tdp for f in gpu)
        assert all(0 <= f[schema.GPU_UTIL] <= 100 for f in gpu)
        assert all(0 <= f[schema.FB_USED] <= f[schema.FB_TOTAL] == 81559 for f in gpu)
        assert all(25 <= f[schema.GPU_TEMP] <= 90 for f in gpu)
    # Utilization moves: a random walk is not a constant.
    assert len({tick[0].fields[schema.GPU_UTIL] for tick in series}) > 5


def test_energy_counter_integrates_power():
    backend = SimulatedBackend("1xH100-80GB", hostname="n", seed=1)
    series = [s[0].fields for s in run(backend, 60)]
    # Each second adds that second's power (W) as mJ * 1000, within rounding to whole mJ.
    for before, after in itertools.pairwise(series):
        assert after[schema.TOTAL_ENERGY] - before[schema.TOTAL_ENERGY] == pytest.approx(
            after[schema.POWER_USAGE] * 1000, abs=2
        )


def test_busy_gpus_run_hot_and_idle_ones_stay_idle():
    busy: set[str] = set()
    backend = SimulatedBackend("2xH100-80GB", hostname="n", seed=3, busy_source=lambda: busy)
    hot, cold = (g.uuid for g in backend.discover())
    busy.add(hot)
    last = run(backend, 90)[-1]
    fields = {s.uuid: s.fields for s in last}
    assert fields[hot][schema.GPU_UTIL] >= 80 and fields[cold][schema.GPU_UTIL] <= 3
    assert fields[hot][schema.POWER_USAGE] > 3 * fields[cold][schema.POWER_USAGE]
    assert fields[hot][schema.GPU_TEMP] > fields[cold][schema.GPU_TEMP]
    assert fields[cold][schema.CLOCK_THROTTLE_REASONS] == 0x1  # GPU idle


def test_injected_xid_is_an_event_and_the_last_xid_field():
    backend = SimulatedBackend("2xH100-80GB", hostname="n")
    backend.inject(1, "xid", xid=94)
    [event] = backend.poll_events(T0)
    assert (event.kind, event.xid, event.uuid) == ("xid", 94, backend.discover()[1].uuid)
    assert backend.poll_events(T0) == []
    assert backend.sample(T0)[1].fields[schema.XID_ERRORS] == 94


def test_injected_double_bit_error_counts_and_raises_xid_48():
    backend = SimulatedBackend("2xH100-80GB", hostname="n")
    uuid = backend.discover()[0].uuid
    backend.inject(uuid, "ecc_dbe")
    assert [e.xid for e in backend.poll_events(T0)] == [48]
    f = backend.sample(T0)[0].fields
    assert (f[schema.ECC_DBE_VOL], f[schema.ECC_DBE_AGG], f[schema.RETIRED_DBE]) == (1, 1, 1)


def test_overheating_gpu_reports_high_temperature_and_thermal_throttling():
    backend = SimulatedBackend("1xH100-80GB", hostname="n")
    backend.inject(0, "overheat", temperature_c=96)
    f = run(backend, 5)[-1][0].fields
    assert f[schema.GPU_TEMP] >= 94
    assert int(f[schema.CLOCK_THROTTLE_REASONS]) & 0x40
    backend.heal(0)
    assert run(backend, 120, start=T0 + timedelta(seconds=10))[-1][0].fields[schema.GPU_TEMP] < 80


def test_a_gpu_that_disappears_is_lost_and_comes_back_after_heal():
    backend = SimulatedBackend("4xA100-40GB", hostname="n")
    collector = GpuCollector(backend)
    gone = backend.discover()[2].uuid
    collector.collect(T0)
    backend.inject(2, "disappear")
    reading = collector.collect(T0 + timedelta(seconds=1))
    assert gone not in {s.uuid for s in reading.samples}
    assert [(e.kind, e.uuid) for e in reading.events] == [("gpu_lost", gone)]
    assert [e.xid for e in backend.poll_events(T0)] == [79]
    assert gone not in {g.uuid for g in collector.facts(T0 + timedelta(seconds=2))}
    backend.heal(gone)
    back = collector.collect(T0 + timedelta(seconds=3))
    assert gone in {s.uuid for s in back.samples}
    assert [e.kind for e in back.events] == ["agent"]
    assert gone in {g.uuid for g in collector.facts(T0 + timedelta(seconds=4))}


def test_unknown_gpu_and_fault_are_refused():
    backend = SimulatedBackend("1xH100-80GB", hostname="n")
    with pytest.raises(KeyError, match="no simulated GPU 5"):
        backend.inject(5, "xid")
    with pytest.raises(ValueError, match="unknown fault"):
        backend.inject(0, "melt")  # type: ignore[arg-type]


# -- MIG and vendors ----------------------------------------------------------------------------------------


def test_mig_spec_gives_every_gpu_the_layout_with_nvidias_profile_figures():
    backend = SimulatedBackend("2xA100-80GB:mig=3g.40gb+2g.20gb+2x1g.10gb", hostname="mig-node")
    assert backend.simulated
    for gpu in backend.discover():
        assert gpu.mig is not None and gpu.mig.current and gpu.mig.pending
        profiles = sorted((d.profile, d.memory_mib, d.compute_slices) for d in gpu.mig.devices)
        assert profiles == [
            ("1g.10gb", 9728, 1),
            ("1g.10gb", 9728, 1),
            ("2g.20gb", 19968, 2),
            ("3g.40gb", 40320, 3),
        ]
        assert all(d.uuid.startswith("MIG-") for d in gpu.mig.devices)
        spans = sorted((d.placement_start, d.memory_slices) for d in gpu.mig.devices)
        ends = [start + size for start, size in spans]  # type: ignore[operator]
        assert all(end <= nxt for end, (nxt, _) in zip(ends, spans[1:], strict=False))  # no overlap
    again = SimulatedBackend("2xA100-80GB:mig=3g.40gb+2g.20gb+2x1g.10gb", hostname="mig-node").discover()
    assert [d.uuid for d in again[0].mig.devices] == [d.uuid for d in backend.discover()[0].mig.devices]  # type: ignore[union-attr]


def test_a100_40gb_offers_its_own_profile_table():
    (gpu,) = SimulatedBackend("A100-40GB:mig=", hostname="n").discover()
    assert gpu.mig is not None and gpu.mig.current and gpu.mig.devices == []
    assert gpu.mig.profiles == {
        "1g.5gb": 7,
        "1g.5gb+me": 1,
        "1g.10gb": 4,
        "2g.10gb": 3,
        "3g.20gb": 2,
        "4g.20gb": 1,
        "7g.40gb": 1,
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("1xL40S:mig=", "L40S has no MIG"),
        ("1xH100-80GB:mig=4g.40gb+4g.40gb", "at most 1 x 4g.40gb"),
        ("1xH100-80GB:mig=4g.40gb+3g.40gb+1g.10gb", "compute slices"),
        ("1xH100-80GB:mig=3g.20gb", "'3g.20gb' is not a MIG profile"),
        # 2g.20gb may start only at memory slices 0, 2 or 4: with a 3g at 4 a third 2g has nowhere to go.
        ("1xH100-80GB:mig=3g.40gb+2g.20gb+2g.20gb+1g.20gb", "compute slices"),
    ],
)
def test_a_mig_layout_the_gpu_cannot_hold_is_refused_in_the_spec(spec, message):
    with pytest.raises(SimulatedSpecError, match=message):
        parse_spec(spec)


def test_placement_rules_refuse_an_overlap_the_slice_counts_alone_would_allow():
    backend = SimulatedBackend("1xH100-80GB:mig=", hostname="n")
    uuid = backend.discover()[0].uuid
    # 4 + 2 = 6 compute slices, but 4g.40gb covers memory slices 0-3 and 1g.20gb x2 need 4-5 and 6-7: fits.
    assert backend.configure_mig(uuid, enabled=True, layout=["4g.40gb", "1g.20gb", "1g.20gb"]).outcome == "applied"
    # 3 x 1g.20gb beside a 4g: only two of its starts (4 and 6) are free.
    result = backend.configure_mig(uuid, enabled=True, layout=["4g.40gb", "1g.20gb", "1g.20gb", "1g.20gb"])
    assert result.outcome == "refused" and "do not fit together" in result.message
    # The refused layout left the previous one in place.
    assert len(backend.discover()[0].mig.devices) == 3  # type: ignore[union-attr]


def test_reconfiguring_and_disabling_mig_in_simulation():
    backend = SimulatedBackend("1xH100-80GB", hostname="n")
    (gpu,) = backend.discover()
    assert gpu.mig is not None and not gpu.mig.current
    assert backend.configure_mig(gpu.uuid, enabled=True, layout=["7g.80gb"]).outcome == "applied"
    assert [d.profile for d in backend.discover()[0].mig.devices] == ["7g.80gb"]  # type: ignore[union-attr]
    assert backend.configure_mig(gpu.uuid, enabled=False, layout=[]).message == "MIG disabled"
    assert backend.discover()[0].mig.devices == []  # type: ignore[union-attr]


def test_a_gpu_without_mig_refuses_reconfiguration():
    backend = SimulatedBackend("1xL40S", hostname="n")
    (gpu,) = backend.discover()
    assert gpu.mig is None
    result = backend.configure_mig(gpu.uuid, enabled=True, layout=["1g.10gb"])
    assert result.outcome == "refused" and "NVML_ERROR_NOT_SUPPORTED" in result.message


def test_amd_models_report_vendor_amd_and_xgmi_peers():
    gpus = SimulatedBackend("4xMI300X", hostname="amd-node").discover()
    assert {g.vendor for g in gpus} == {"amd"}
    assert all(len(g.nvlink_peers) == 3 and g.mig is None for g in gpus)
    assert gpus[0].name == "AMD Instinct MI300X" and gpus[0].memory_total_mib == 196592
    assert SimulatedBackend("1xMI250X", hostname="a").discover()[0].name == "AMD Instinct MI250X"


def test_a_busy_mig_device_makes_its_parent_gpu_busy():
    busy: set[str] = set()
    backend = SimulatedBackend("1xH100-80GB:mig=7g.80gb", hostname="n", seed=1, busy_source=lambda: busy)
    (gpu,) = backend.discover()
    assert gpu.mig is not None
    busy.add(gpu.mig.devices[0].uuid)
    t = datetime(2026, 5, 1, tzinfo=UTC)
    for _ in range(5):
        t += timedelta(seconds=1)
        (sample,) = backend.sample(t)
    assert sample.fields[schema.GPU_UTIL] > 50  # type: ignore[operator]
