/** The efficiency statement's figures (GET usage/efficiency, docs/efficiency.md) and how the page compares them. */

export interface EfficiencyFigures {
  held_gpu_hours: number;
  idle_gpu_hours: number;
  idle_share: number | null;
  util_mean_percent: number | null;
  low_util_share: number | null;
  energy_kwh: number;
  facility_energy_kwh: number;
  energy_cost: string;
  energy_currency: string;
  energy_wh_per_gpu_hour: number | null;
  credits: string;
  idle_credits: string;
  /** Whether the held time has DCGM profiling readings (GPM, Hopper and newer): all of it, some, or none. */
  profiling: Profiling;
  profiled_gpu_hours: number;
  /** Profiling readings, weighted by held time; null where not measured (never a zero). */
  sm_active_percent: number | null;
  tensor_active_percent: number | null;
  dram_active_percent: number | null;
}

export type Profiling = "measured" | "partly measured" | "not measured";

/** A profiling reading as a cell: "not measured" where the GPUs gave none (utilization only), and "(part)"
 * where only some of the held time was measured. */
export function formatProfiling(value: number | null, profiling: Profiling): string {
  if (value == null || profiling === "not measured") return "not measured";
  return `${value.toFixed(1)}%${profiling === "partly measured" ? " (part)" : ""}`;
}

export interface WastedReservation extends EfficiencyFigures {
  reservation: string | null;
  name: string;
}

export interface EfficiencyStatement {
  project: string;
  period: string;
  provisional: boolean;
  low_util_percent: number;
  totals: EfficiencyFigures;
  previous: EfficiencyFigures & { period: string };
  fleet: EfficiencyFigures;
  reservations: WastedReservation[];
}

export interface RankedProject extends EfficiencyFigures {
  rank: number;
  project: string;
}

export interface EfficiencyRanking {
  period: string;
  provisional: boolean;
  fleet: EfficiencyFigures;
  projects: RankedProject[];
}

/** "2026-11": the current UTC month. */
export function currentMonth(now: Date = new Date()): string {
  return now.toISOString().slice(0, 7);
}

/** A share (0..1) as a percentage, "–" when unknown. */
export function formatShare(share: number | null | undefined): string {
  return share == null ? "–" : `${(share * 100).toFixed(1)}%`;
}

/**
 * How a figure moved against another month or the fleet, in words a reader can act on: "12.0 points better".
 * ``higherIsBetter`` says which way is good (utilization up is better; idle share up is worse).
 */
export function compare(
  value: number | null | undefined,
  other: number | null | undefined,
  { higherIsBetter, unit = "points", scale = 1 }: { higherIsBetter: boolean; unit?: string; scale?: number },
): string {
  if (value == null || other == null) return "no comparison";
  const delta = (value - other) * scale;
  if (Math.abs(delta) < 0.05) return "the same";
  const better = higherIsBetter ? delta > 0 : delta < 0;
  return `${Math.abs(delta).toFixed(1)} ${unit} ${better ? "better" : "worse"}`;
}
