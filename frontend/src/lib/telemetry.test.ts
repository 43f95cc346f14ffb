import { describe, expect, it } from "vitest";

import type { GpuTelemetry } from "../api/types";
import {
  TELEMETRY_CHARTS,
  appendSample,
  chartData,
  formatChartValue,
  gpuSamples,
  mergeSeries,
  rememberLatest,
  seriesStyle,
  telemetrySince,
} from "./telemetry";
import { reportRange } from "./report";

describe("telemetry history", () => {
  it("keeps a sample once, by its own timestamp, and bounds the history", () => {
    let h = appendSample([], { t: 1000, u: 1 });
    const same = appendSample(h, { t: 1000, u: 2 });
    expect(same).toBe(h);
    h = appendSample(h, { t: 2000, u: 3 }, 1);
    expect(h).toEqual([{ t: 2000, u: 3 }]);
  });

  it("merges GPUs into rows by time and skips missing fields", () => {
    const rows = mergeSeries(
      { "a/0": [{ t: 1000, u: 10 }, { t: 2000, u: 20 }], "a/1": [{ t: 1200, u: 5 }, { t: 3000, p: 1 }] },
      "u",
    );
    expect(rows).toEqual([{ t: 1000, "a/0": 10, "a/1": 5 }, { t: 2000, "a/0": 20 }]);
  });
});

function gpu(over: Partial<GpuTelemetry> = {}): GpuTelemetry {
  return {
    uuid: "GPU-1",
    index: 0,
    server: "gpu-a",
    model: "H100-80GB",
    memory_mib: 81920,
    simulated: false,
    held_from: "2025-03-01T10:00:00Z",
    held_until: "2025-03-01T12:00:00Z",
    live: true,
    latest: null,
    minutes: [],
    ...over,
  };
}

function minute(at: string, util: number | null, fb: number | null = 1024, power: number | null = 300) {
  return { minute: at, samples: 12, util_avg: util, util_max: util, fb_used_max_mib: fb, power_avg_w: power, temp_max_c: 60 };
}

describe("reservation telemetry charts", () => {
  it("plots the minute series then the latest sample as the last point", () => {
    const g = gpu({
      minutes: [minute("2025-03-01T10:00:00Z", 40), minute("2025-03-01T10:01:00Z", 50)],
      latest: { at: "2025-03-01T10:01:42Z", values: { DCGM_FI_DEV_GPU_UTIL: 97, DCGM_FI_DEV_POWER_USAGE: 650 } },
    });
    const samples = gpuSamples(g);
    expect(samples.map((s) => s.util)).toEqual([40, 50, 97]);
    expect(samples[2].t).toBe(Date.parse("2025-03-01T10:01:42Z"));
    // The latest sample carried no memory figure: the memory line stops at the last minute, it does not drop to 0.
    expect(samples[2].memory).toBeUndefined();
    expect(samples[2].power).toBe(650);
  });

  it("drops a latest sample that is not newer than the last minute", () => {
    const g = gpu({
      minutes: [minute("2025-03-01T10:01:00Z", 50)],
      latest: { at: "2025-03-01T10:00:59Z", values: { DCGM_FI_DEV_GPU_UTIL: 1 } },
    });
    expect(gpuSamples(g).map((s) => s.util)).toEqual([50]);
  });

  it("leaves a field the GPU does not report out of its chart", () => {
    const a = gpu({ minutes: [minute("2025-03-01T10:00:00Z", null, 2048, null)] });
    const b = gpu({ index: 1, minutes: [minute("2025-03-01T10:00:00Z", 70)] });
    const util = chartData([a, b], "util");
    expect(util.series).toEqual(["gpu-a/1"]);
    expect(util.rows).toEqual([{ t: Date.parse("2025-03-01T10:00:00Z"), "gpu-a/1": 70 }]);
    expect(chartData([a, b], "memory").series).toEqual(["gpu-a/0", "gpu-a/1"]);
  });

  it("keeps the latest samples of earlier polls until a minute covers them", () => {
    const at = (iso: string, util: number) => ({ at: iso, values: { DCGM_FI_DEV_GPU_UTIL: util } });
    let recent = rememberLatest({}, [gpu({ latest: at("2025-03-01T10:00:05Z", 10) })]);
    recent = rememberLatest(recent, [gpu({ latest: at("2025-03-01T10:00:05Z", 10) })]);
    recent = rememberLatest(recent, [gpu({ latest: at("2025-03-01T10:01:10Z", 20) })]);
    expect(recent["gpu-a/0"].map((s) => s.util)).toEqual([10, 20]);
    const now = gpu({ minutes: [minute("2025-03-01T10:00:00Z", 12)], latest: at("2025-03-01T10:01:15Z", 30) });
    // 10:00:05 is inside the 10:00 minute, which the server has folded: it is not plotted twice.
    expect(gpuSamples(now, recent["gpu-a/0"]).map((s) => s.util)).toEqual([12, 20, 30]);
  });

  it("plots memory in GiB", () => {
    const g = gpu({
      minutes: [minute("2025-03-01T10:00:00Z", 40, 81920)],
      latest: { at: "2025-03-01T10:01:42Z", values: { DCGM_FI_DEV_FB_USED: 40960 + 512 } },
    });
    expect(chartData([g], "memory").rows.map((r) => r["gpu-a/0"])).toEqual([80, 40.5]);
  });

  it("rounds a value to its chart's digits and names its unit", () => {
    const chart = (key: string) => TELEMETRY_CHARTS.find((c) => c.key === key)!;
    expect(formatChartValue(620.85136363636, chart("power"))).toBe("621 W");
    expect(formatChartValue(75.23456, chart("memory"))).toBe("75.2 GiB");
    expect(formatChartValue(80, chart("memory"))).toBe("80 GiB");
    expect(formatChartValue(97.4, chart("util"))).toBe("97%");
    expect(formatChartValue(Number.NaN, chart("util"))).toBe("–");
  });

  it("draws every GPU's line differently, so equal figures do not hide a GPU", () => {
    const styles = [0, 1, 2].map((i) => seriesStyle(i, 3));
    expect(new Set(styles.map((s) => JSON.stringify(s))).size).toBe(3);
    // The lower lines are wider than the ones drawn over them.
    expect(styles[0].strokeWidth).toBeGreaterThan(styles[1].strokeWidth);
    expect(styles[1].strokeWidth).toBeGreaterThan(styles[2].strokeWidth);
    expect(styles[0].strokeDasharray).toBeUndefined();
    expect(styles[1].strokeDasharray).toBeDefined();
  });

  it("has no rows when no GPU sent anything", () => {
    expect(chartData([gpu()], "util")).toEqual({ rows: [], series: [] });
  });
});

describe("telemetrySince", () => {
  const now = Date.parse("2025-03-01T12:00:00Z");
  const w = (starts: string, ends: string) => ({ starts_at: starts, ends_at: ends });

  it("starts at the window's opening when it opened less than an hour ago", () => {
    expect(telemetrySince(w("2025-03-01T11:30:00Z", "2025-03-01T14:00:00Z"), now)).toBe("2025-03-01T11:30:00.000Z");
  });

  it("keeps the last hour of a long running window", () => {
    expect(telemetrySince(w("2025-03-01T02:00:00Z", "2025-03-02T00:00:00Z"), now)).toBe("2025-03-01T11:00:00.000Z");
  });

  it("shows the last hour of a window that ended", () => {
    expect(telemetrySince(w("2025-03-01T06:00:00Z", "2025-03-01T09:00:00Z"), now)).toBe("2025-03-01T08:00:00.000Z");
  });

  it("asks nothing before the window opens or a day after it closed", () => {
    expect(telemetrySince(w("2025-03-01T13:00:00Z", "2025-03-01T14:00:00Z"), now)).toBeNull();
    expect(telemetrySince(w("2025-02-27T00:00:00Z", "2025-02-28T00:00:00Z"), now)).toBeNull();
  });

  it("never reaches further back than the server allows", () => {
    const since = telemetrySince(w("2025-02-28T00:00:00Z", "2025-02-28T12:30:00Z"), now);
    expect(since).toBe("2025-02-28T12:01:00.000Z");
  });
});

describe("reportRange", () => {
  it("turns form dates into UTC midnights the report accepts", () => {
    expect(reportRange("2025-03-01", "2025-04-01")).toEqual({ start: "2025-03-01T00:00:00Z", end: "2025-04-01T00:00:00Z" });
  });

  it("passes anything else through so the server names the field", () => {
    expect(reportRange("", "x").start).toBe("");
  });
});
