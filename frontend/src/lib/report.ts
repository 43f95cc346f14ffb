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
}

export interface UsageReport {
  project: string | null;
  start: string;
  end: string;
  group_by: string;
  rows: UsageRow[];
  totals: UsageRow;
}

export interface UsagePoint {
  at: string;
  held_gpu_hours: number;
  used_gpu_hours: number;
  idle_gpu_hours: number;
  util_mean_percent: number | null;
  energy_kwh: number;
  credits: string;
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
