// Client-side history of the latest telemetry sample per GPU: the API gives only "latest", so the charts are
// built from what this page has polled, de-duplicated by the sample's own timestamp.

export interface Sample {
  t: number; // epoch ms of the sample (telemetry_at), not of the poll
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
