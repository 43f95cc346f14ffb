// Shapes of the accounting API's report and time series, and the range the report accepts.

export interface UsageRow {
  key: string;
  label: string;
  booked_gpu_hours: number;
  used_gpu_hours: number;
  held_gpu_hours: number;
  idle_gpu_hours: number;
  util_mean_percent: number | null;
  low_utilization: boolean;
  energy_kwh: number;
  credits: string;
  cost: string | null;
  currency: string;
  /** Still settling: a reservation not settled yet (credits estimated) or an hour not rolled up for good. */
  provisional: boolean;
}

export interface UsageReport {
  project: string | null;
  provisional: boolean;
  /** Telemetry of hours before this is final; null before the first rollup. */
  final_until: string | null;
  start: string;
  end: string;
  group_by: string;
  rows: UsageRow[];
  totals: UsageRow;
  /** GPU-hours released by idle reclamation in the range (absent from servers before it existed). */
  reclaimed_gpu_hours?: number;
  reclaimed_by_project?: Record<string, number>;
}

export interface UsagePoint {
  at: string;
  held_gpu_hours: number;
  used_gpu_hours: number;
  idle_gpu_hours: number;
  util_mean_percent: number | null;
  energy_kwh: number;
  credits: string;
  provisional: boolean;
}

/**
 * The report splits usage by UTC hour, so both ends must fall on one; dates from the form become UTC
 * midnights. An "until" before "from" is passed as given so the server names the field in its refusal.
 */
export function reportRange(from: string, until: string): { start: string; end: string } {
  const day = /^\d{4}-\d{2}-\d{2}$/;
  return {
    start: day.test(from) ? `${from}T00:00:00Z` : from,
    end: day.test(until) ? `${until}T00:00:00Z` : until,
  };
}

// The zone figures are shown in is the portal's one zone setting (the viewer's or UTC).
export { shownZone } from "./format";

export interface LedgerLine {
  id: number;
  kind: string;
  amount: string;
  reservation: string | null;
  reason: string;
  actor_label: string;
  created_at: string;
}

export interface ReservationMoney {
  reservation: string;
  held: number;
  released: number;
  charged: number;
  refunded: number;
}

/** A reservation's ledger entries summed by kind (as positive credits), for the plain-words explanation. */
export function moneyByReservation(entries: LedgerLine[]): ReservationMoney[] {
  const out = new Map<string, ReservationMoney>();
  for (const e of entries) {
    if (!e.reservation) continue;
    const m = out.get(e.reservation) ?? { reservation: e.reservation, held: 0, released: 0, charged: 0, refunded: 0 };
    const amount = Math.abs(Number(e.amount) || 0);
    if (e.kind === "hold") m.held += amount;
    else if (e.kind === "release") m.released += amount;
    else if (e.kind === "charge") m.charged += amount;
    else if (e.kind === "refund") m.refunded += amount;
    out.set(e.reservation, m);
  }
  return [...out.values()];
}

const fmt = (n: number) => n.toLocaleString("en-US", { maximumFractionDigits: 2 });

/** "Booking held 4 credits; ..." in plain words: what happened to one reservation's credits so far. */
export function explainMoney(m: ReservationMoney): string {
  const parts = [`When it was booked (or extended), ${fmt(m.held)} credits were held for its whole window.`];
  if (m.released > 0 || m.charged > 0) {
    parts.push(
      `When it ended, the hold was released in full (${fmt(m.released)} credits back) and ${fmt(m.charged)} credits were charged for the time its container ran.`,
    );
    parts.push(`Net cost: ${fmt(m.charged - m.refunded)} credits${m.refunded > 0 ? ` after ${fmt(m.refunded)} refunded` : ""}.`);
  } else {
    parts.push("It has not ended yet: the hold stays until it does, then it is released and what it used is charged.");
  }
  return parts.join(" ");
}
