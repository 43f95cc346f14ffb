// Formatting shared across pages. The API speaks UTC ISO 8601; the portal shows every time in one format,
// "01 Dec 2026, 12:00", in one zone: the viewer's (the browser's) or UTC, as the header's toggle sets it.

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

// --- the zone shown ---------------------------------------------------------------------------------

export type ZoneMode = "viewer" | "utc";
const ZONE_KEY = "portal.zone";
const listeners = new Set<() => void>();

function storage(): Storage | null {
  try {
    return typeof localStorage === "undefined" ? null : localStorage;
  } catch {
    return null; // storage refused (privacy settings): the choice lasts for the page view
  }
}

let mode: ZoneMode = storage()?.getItem(ZONE_KEY) === "utc" ? "utc" : "viewer";

/** The browser's own IANA zone, e.g. "Europe/Berlin". */
export function viewerZone(): string {
  return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
}

export function zoneMode(): ZoneMode {
  return mode;
}

/** Show times in the viewer's zone or in UTC; remembered in localStorage, and every subscriber re-renders. */
export function setZoneMode(next: ZoneMode): void {
  mode = next;
  storage()?.setItem(ZONE_KEY, next);
  listeners.forEach((l) => l());
}

export function subscribeZone(listener: () => void): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

/** The IANA zone every time is shown in now. */
export function shownZone(): string {
  return mode === "utc" ? "UTC" : viewerZone();
}

const partsFormatters = new Map<string, Intl.DateTimeFormat>();
function partsFormatter(zone: string): Intl.DateTimeFormat {
  let f = partsFormatters.get(zone);
  if (!f) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: zone,
      hourCycle: "h23",
      year: "numeric",
      month: "numeric",
      day: "numeric",
      hour: "numeric",
      minute: "numeric",
      second: "numeric",
      weekday: "short",
    });
    partsFormatters.set(zone, f);
  }
  return f;
}

export interface ZoneParts {
  year: number;
  month: number; // 1..12
  day: number;
  hour: number; // 0..23
  minute: number;
  second: number;
  weekday: string; // Mon..Sun
}

/** The wall-clock reading of instant `ms` in `zone`. */
export function zoneParts(ms: number, zone: string = shownZone()): ZoneParts {
  const out: Record<string, string> = {};
  for (const p of partsFormatter(zone).formatToParts(new Date(ms))) out[p.type] = p.value;
  return {
    year: Number(out.year),
    month: Number(out.month),
    day: Number(out.day),
    hour: Number(out.hour) % 24,
    minute: Number(out.minute),
    second: Number(out.second),
    weekday: out.weekday,
  };
}

/** How far `zone`'s clock is ahead of UTC at instant `ms`, in ms (Berlin in winter: +3 600 000). */
export function zoneOffset(ms: number, zone: string = shownZone()): number {
  const p = zoneParts(ms, zone);
  const wall = Date.UTC(p.year, p.month - 1, p.day, p.hour, p.minute, p.second);
  return wall - Math.floor(ms / 1000) * 1000;
}

/** The instant at which `zone`'s clock reads the given wall time (a time skipped by a DST change moves on). */
export function fromZoneWall(year: number, month: number, day: number, hour: number, minute: number, zone: string = shownZone()): number {
  const wall = Date.UTC(year, month - 1, day, hour, minute);
  const t = wall - zoneOffset(wall, zone);
  const offset = zoneOffset(t, zone); // the offset at the answer, which differs near a DST change
  return wall - offset;
}

/** "Europe/Berlin (UTC+01:00)" for the zone shown, at instant `at`. */
export function zoneLabel(zone: string = shownZone(), at: number = Date.now()): string {
  if (zone === "UTC") return "UTC";
  const off = Math.round(zoneOffset(at, zone) / 60_000);
  const sign = off < 0 ? "−" : "+";
  const abs = Math.abs(off);
  return `${zone} (UTC${sign}${pad2(Math.floor(abs / 60))}:${pad2(abs % 60)})`;
}

const pad2 = (n: number) => String(n).padStart(2, "0");
export const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

function instant(value: string | number | Date | null | undefined): number | null {
  if (value === null || value === undefined || value === "") return null;
  const t = value instanceof Date ? value.getTime() : typeof value === "number" ? value : Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

/** The portal's one date format, in the zone shown: "01 Dec 2026, 12:00". */
export function formatDateTime(value: string | number | Date | null | undefined, zone: string = shownZone()): string {
  const t = instant(value);
  if (t === null) return value ? String(value) : "–";
  const p = zoneParts(t, zone);
  return `${pad2(p.day)} ${MONTHS[p.month - 1]} ${p.year}, ${pad2(p.hour)}:${pad2(p.minute)}`;
}

/** The date alone, for axis rows: "Tue 01 Dec". */
export function formatDay(ms: number, zone: string = shownZone()): string {
  const p = zoneParts(ms, zone);
  return `${p.weekday} ${pad2(p.day)} ${MONTHS[p.month - 1]}`;
}

/** The clock time alone: "13:00". */
export function formatClock(ms: number, zone: string = shownZone()): string {
  const p = zoneParts(ms, zone);
  return `${pad2(p.hour)}:${pad2(p.minute)}`;
}

const WRITTEN = /^\s*(\d{1,2})\s+([A-Za-z]{3,9})\.?\s+(\d{4}),?\s+(\d{1,2}):(\d{2})\s*$/;

/** Reads a time written in the one format ("01 Dec 2026, 12:00") as a wall time in `zone`; null if it is not. */
export function parseDateTime(text: string, zone: string = shownZone()): number | null {
  const m = WRITTEN.exec(text);
  if (!m) return null;
  const [day, monthName, year, hour, minute] = [Number(m[1]), m[2].toLowerCase(), Number(m[3]), Number(m[4]), Number(m[5])];
  const month = MONTHS.findIndex((name) => monthName.startsWith(name.toLowerCase())) + 1;
  if (month < 1 || day < 1 || hour > 23 || minute > 59) return null;
  const daysInMonth = new Date(Date.UTC(year, month, 0)).getUTCDate();
  if (day > daysInMonth) return null;
  return fromZoneWall(year, month, day, hour, minute, zone);
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
  if (value === null || value === undefined || !Number.isFinite(value)) return "var(--mantine-color-gray-7)";
  const f = Math.min(1, Math.max(0, value / max));
  const hue = Math.round(120 - 120 * f);
  // Lightness 28%: white text on the cell reaches 4.5:1 at every hue (at 45% green gave 2.35:1).
  return `hsl(${hue} 70% 28%)`;
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
