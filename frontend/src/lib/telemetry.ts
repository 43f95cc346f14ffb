// Chart data for a reservation's GPUs: the server's per-minute series, then the latest samples this page has
// polled. Minute points sit at the start of their minute; a polled sample is an instant, kept only when it
// falls after the last minute the server has folded (else it is in that minute's figures already).

import type { GpuTelemetry, TelemetryMinute } from "../api/types";

export interface Sample {
  t: number; // epoch ms of the sample or of the minute's start, not of the poll
  [series: string]: number;
}

export function appendSample(history: Sample[], sample: Sample, max = 120): Sample[] {
  const last = history[history.length - 1];
  if (last && sample.t <= last.t) return history;
  const next = [...history, sample];
  return next.length > max ? next.slice(next.length - max) : next;
}

/** Merge per-GPU histories into chart rows keyed by time: {t, "GPU 0": v, "GPU 1": v}. */
export function mergeSeries(byGpu: Record<string, Sample[]>, field: string): Record<string, number>[] {
  const rows = new Map<number, Record<string, number>>();
  for (const [label, samples] of Object.entries(byGpu)) {
    for (const s of samples) {
      if (s[field] === undefined) continue;
      // Agents sample on their own clocks; bucketing to the second lines up GPUs of one heartbeat.
      const key = Math.round(s.t / 1000) * 1000;
      const row = rows.get(key) ?? { t: key };
      row[label] = s[field];
      rows.set(key, row);
    }
  }
  return [...rows.values()].sort((a, b) => a.t - b.t);
}

/** One chart: which minute aggregate and which DCGM field of the latest sample it plots. */
export interface ChartField {
  key: string;
  title: string;
  unit: string;
  minute: keyof Pick<
    TelemetryMinute,
    "util_avg" | "fb_used_max_mib" | "power_avg_w" | "sm_active_avg" | "tensor_active_avg" | "dram_active_avg"
  >;
  dcgm: string;
  /** The plotted value is the reported one times this (memory: MiB reported, GiB plotted). */
  scale?: number;
  /** Decimals shown on the axis and in the tooltip. */
  digits: number;
}

export const TELEMETRY_CHARTS: ChartField[] = [
  { key: "util", title: "Utilization", unit: "%", digits: 0, minute: "util_avg", dcgm: "DCGM_FI_DEV_GPU_UTIL" },
  {
    key: "memory",
    title: "Memory used",
    unit: " GiB",
    scale: 1 / 1024,
    digits: 1,
    minute: "fb_used_max_mib",
    dcgm: "DCGM_FI_DEV_FB_USED",
  },
  { key: "power", title: "Power", unit: " W", digits: 0, minute: "power_avg_w", dcgm: "DCGM_FI_DEV_POWER_USAGE" },
  // DCGM's profiling fields (ratios, plotted as %): the evidence of real work that utilization alone is not
  // (a busy loop reads 100 % utilization and almost no SM activity). Null on GPUs without GPM.
  { key: "sm", title: "SM active", unit: "%", scale: 100, digits: 0, minute: "sm_active_avg", dcgm: "DCGM_FI_PROF_SM_ACTIVE" },
  {
    key: "tensor",
    title: "Tensor pipes active",
    unit: "%",
    scale: 100,
    digits: 0,
    minute: "tensor_active_avg",
    dcgm: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
  },
  { key: "dram", title: "DRAM active", unit: "%", scale: 100, digits: 0, minute: "dram_active_avg", dcgm: "DCGM_FI_PROF_DRAM_ACTIVE" },
];

/** A chart's value as its axis and tooltip show it: "621 W", "75.2 GiB", "97%". */
export function formatChartValue(value: number, chart: Pick<ChartField, "unit" | "digits">): string {
  if (!Number.isFinite(value)) return "–";
  const text = value.toLocaleString("en-US", { maximumFractionDigits: chart.digits, minimumFractionDigits: 0 });
  return `${text}${chart.unit}`;
}

/**
 * How the i-th of n GPU lines is drawn, beyond its colour: GPUs reporting the same figures draw the same
 * line, so each lower line is wider and each upper one dashed, and every GPU stays visible on top of another.
 */
export function seriesStyle(i: number, n: number): { strokeWidth: number; strokeDasharray?: string } {
  const strokeWidth = 2 + 2 * Math.max(0, n - 1 - i);
  const dashes = [undefined, "6 4", "2 3", "10 3 2 3"];
  const strokeDasharray = dashes[i % dashes.length];
  return strokeDasharray ? { strokeWidth, strokeDasharray } : { strokeWidth };
}

export function gpuLabel(gpu: Pick<GpuTelemetry, "server" | "index">): string {
  return `${gpu.server}/${gpu.index}`;
}

function pick(charts: ChartField[], t: number, value: (c: ChartField) => number | null | undefined): Sample {
  const s: Sample = { t };
  for (const c of charts) {
    const v = value(c);
    if (typeof v === "number") s[c.key] = v * (c.scale ?? 1);
  }
  return s;
}

export function latestSample(gpu: GpuTelemetry, charts: ChartField[] = TELEMETRY_CHARTS): Sample | null {
  const latest = gpu.latest;
  return latest ? pick(charts, Date.parse(latest.at), (c) => latest.values[c.dcgm]) : null;
}

/** Latest samples seen over the page's polls, per GPU: they fill the gap until the server folds a minute. */
export type RecentSamples = Record<string, Sample[]>;

export function rememberLatest(recent: RecentSamples, gpus: GpuTelemetry[], max = 120): RecentSamples {
  let next = recent;
  for (const gpu of gpus) {
    const sample = latestSample(gpu);
    if (!sample) continue;
    const label = gpuLabel(gpu);
    const before = recent[label] ?? [];
    const after = appendSample(before, sample, max);
    if (after !== before) next = { ...next, [label]: after };
  }
  return next;
}

/**
 * A GPU's points for every chart, by chart key: its minutes, then the latest samples polled since the last
 * minute began. A field the GPU did not report is left out, never zero.
 */
export function gpuSamples(gpu: GpuTelemetry, recent: Sample[] = [], charts: ChartField[] = TELEMETRY_CHARTS): Sample[] {
  let samples: Sample[] = [];
  const points = gpu.minutes.map((m) => pick(charts, Date.parse(m.minute), (c) => m[c.minute]));
  // Polled samples inside a minute the server has already folded (the open one included) are in its figures.
  const folded = points.length ? points[points.length - 1].t + 60_000 : Number.NEGATIVE_INFINITY;
  points.push(...recent.filter((s) => s.t >= folded));
  // The latest sample is the live point even inside the open minute.
  const latest = latestSample(gpu, charts);
  if (latest) points.push(latest);
  for (const p of points) samples = appendSample(samples, p, Number.POSITIVE_INFINITY);
  return samples;
}

/** Rows for one chart across the reservation's GPUs, and the series (GPU labels) that have any point. */
export function chartData(
  gpus: GpuTelemetry[],
  key: string,
  recent: RecentSamples = {},
): { rows: Record<string, number>[]; series: string[] } {
  const byGpu: Record<string, Sample[]> = {};
  for (const gpu of gpus) byGpu[gpuLabel(gpu)] = gpuSamples(gpu, recent[gpuLabel(gpu)]);
  const rows = mergeSeries(byGpu, key);
  const series = Object.keys(byGpu)
    .filter((label) => byGpu[label].some((s) => s[key] !== undefined))
    .sort();
  return { rows, series };
}

const HOUR = 3_600_000;
/** The server keeps a tenant's minute series reachable for a day; older windows are the usage reports' job. */
export const MAX_LOOKBACK_MS = 24 * HOUR;

/**
 * Where the charts start: the last hour of the window so far (or of the window, once it ended), never
 * before the window opened. Null when the window has not opened yet or closed more than a day ago.
 */
export function telemetrySince(
  window: { starts_at: string; ends_at: string },
  now: number,
  lookbackMs = HOUR,
): string | null {
  const start = Date.parse(window.starts_at);
  const end = Math.min(Date.parse(window.ends_at), now);
  if (start > now) return null;
  // A minute of slack so a client clock a little ahead of the server's is not refused.
  const since = Math.max(start, end - lookbackMs, now - MAX_LOOKBACK_MS + 60_000);
  if (since >= end) return null;
  return new Date(since).toISOString();
}
