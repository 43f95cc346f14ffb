// Formatting shared across pages. Times are shown in the browser's zone; the API speaks UTC ISO 8601.

export function formatCredits(value: string | number | null | undefined): string {
  if (value === null || value === undefined || value === "") return "–";
  const n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  return n.toLocaleString("en-US", { minimumFractionDigits: 0, maximumFractionDigits: 2 });
}

export function formatMiB(mib: number | null | undefined): string {
  if (mib === null || mib === undefined || !Number.isFinite(mib)) return "–";
  if (mib >= 1024) return `${(mib / 1024).toFixed(mib % 1024 === 0 ? 0 : 1)} GiB`;
  return `${mib} MiB`;
}

export function formatPercent(value: number | null | undefined, digits = 0): string {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  return `${value.toFixed(digits)}%`;
}

export function formatHours(hours: number): string {
  if (!Number.isFinite(hours)) return "–";
  if (hours < 1) return `${Math.round(hours * 60)} min`;
  const rounded = Math.round(hours * 100) / 100;
  return `${rounded} h`;
}

export function formatDateTime(iso: string | null | undefined): string {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return d.toLocaleString("en-GB", {
    year: "numeric",
    month: "short",
    day: "2-digit",
    hour: "2-digit",
    minute: "2-digit",
  });
}

/** "in 3 h", "12 min ago": relative to `now` (injectable for tests). */
export function formatRelative(iso: string, now: number = Date.now()): string {
  const diff = new Date(iso).getTime() - now;
  const abs = Math.abs(diff);
  const minutes = Math.round(abs / 60_000);
  let text: string;
  if (minutes < 1) return "now";
  if (minutes < 60) text = `${minutes} min`;
  else if (minutes < 48 * 60) text = `${Math.round(minutes / 60)} h`;
  else text = `${Math.round(minutes / 1440)} d`;
  return diff > 0 ? `in ${text}` : `${text} ago`;
}

/** A value for <input type="datetime-local"> in local time, minute precision. */
export function toLocalInput(d: Date): string {
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

export function fromLocalInput(value: string): Date | null {
  if (!value) return null;
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? null : d;
}

export function shortUuid(uuid: string): string {
  return uuid.length > 14 ? `${uuid.slice(0, 12)}…` : uuid;
}

/** Colour for a 0..100 value on a green→red scale, for heatmaps. */
export function heatColor(value: number | null | undefined, max = 100): string {
  if (value === null || value === undefined || !Number.isFinite(value)) return "var(--mantine-color-gray-3)";
  const f = Math.min(1, Math.max(0, value / max));
  const hue = Math.round(120 - 120 * f);
  return `hsl(${hue} 70% 45%)`;
}

export const ACTIVE_STATES = new Set(["pending", "scheduled", "starting", "running", "ending"]);
export const STATE_COLOR: Record<string, string> = {
  pending: "gray",
  scheduled: "blue",
  starting: "cyan",
  running: "green",
  ending: "yellow",
  completed: "teal",
  cancelled: "gray",
  failed: "red",
  interrupted: "orange",
  ready: "green",
  draining: "yellow",
  maintenance: "orange",
  offline: "red",
  retired: "gray",
  commissioning: "blue",
  healthy: "green",
  unhealthy: "red",
};

/** A length of time: "45 s", "6 min", "2 h 5 min", "3 d 4 h". */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "–";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return minutes % 60 ? `${hours} h ${minutes % 60} min` : `${hours} h`;
  const days = Math.floor(hours / 24);
  return hours % 24 ? `${days} d ${hours % 24} h` : `${days} d`;
}
