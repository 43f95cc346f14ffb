// Layout math for the availability Gantt: where a segment sits on a track, where the axis marks go (in the
// zone shown), and what a click or a key press on a track means.

import { formatClock, formatDay, shownZone, zoneOffset, zoneParts } from "./format";

const HOUR = 3_600_000;

export interface Range {
  start: number; // epoch ms
  end: number;
}

export interface Placed {
  /** Percent of the track's width from its left edge, 0..100. */
  left: number;
  width: number;
  clippedStart: boolean;
  clippedEnd: boolean;
}

/** Place [s, e) on a track covering `range`; null when it lies wholly outside. */
export function placeSegment(range: Range, s: number, e: number): Placed | null {
  const span = range.end - range.start;
  if (span <= 0 || e <= range.start || s >= range.end || e <= s) return null;
  const from = Math.max(s, range.start);
  const to = Math.min(e, range.end);
  return {
    left: ((from - range.start) / span) * 100,
    width: ((to - from) / span) * 100,
    clippedStart: s < range.start,
    clippedEnd: e > range.end,
  };
}

/** Free gaps of a track within the range, given its busy segments (any order, may overlap). */
export function freeGaps(range: Range, busy: { start: number; end: number }[]): Range[] {
  const sorted = busy
    .map((b) => ({ start: Math.max(b.start, range.start), end: Math.min(b.end, range.end) }))
    .filter((b) => b.end > b.start)
    .sort((a, b) => a.start - b.start);
  const gaps: Range[] = [];
  let cursor = range.start;
  for (const b of sorted) {
    if (b.start > cursor) gaps.push({ start: cursor, end: b.start });
    cursor = Math.max(cursor, b.end);
  }
  if (cursor < range.end) gaps.push({ start: cursor, end: range.end });
  return gaps;
}

/**
 * Which instant a click at `fraction` (0..1) of the track means, snapped down to `snapMs` of a clock
 * `offsetMs` ahead of UTC (the zone shown, so that half-hour zones snap to their own whole hours).
 */
export function instantAt(range: Range, fraction: number, snapMs = HOUR, offsetMs = 0): number {
  const f = Math.min(1, Math.max(0, fraction));
  const t = range.start + f * (range.end - range.start);
  return Math.floor((t + offsetMs) / snapMs) * snapMs - offsetMs;
}

export interface AxisDay {
  at: number; // where the day (or the range) begins
  left: number;
  width: number;
  label: string; // "Tue 01 Dec"
}

export interface AxisHour {
  at: number;
  left: number;
  label: string; // "13:00"; empty for the day lines of a range too long for hour labels
  midnight: boolean;
}

const HOUR_STEPS = [1, 2, 3, 6, 12];

/**
 * The axis of a track `trackPx` wide covering `range`, in `zone`'s wall time: a row of dates (one band per
 * calendar day, clipped to the range) and hour gridlines at whole hours of the zone, every 1, 2, 3, 6 or 12
 * hours, the finest that leaves `minGapPx` between labels; when even 12 hours are too close, lines at
 * midnight only, unlabelled (the date row names them).
 */
export function axis(range: Range, trackPx: number, zone: string = shownZone(), minGapPx = 38): { days: AxisDay[]; hours: AxisHour[]; stepHours: number } {
  const span = range.end - range.start;
  if (span <= 0 || trackPx <= 0) return { days: [], hours: [], stepHours: 0 };
  const pxPerHour = (trackPx * HOUR) / span;
  const step = HOUR_STEPS.find((h) => h * pxPerHour >= minGapPx) ?? 24;
  const pct = (t: number) => ((t - range.start) / span) * 100;
  // The first whole hour of the zone's clock at or after the start (zones may sit half an hour off UTC).
  const offset = zoneOffset(range.start, zone);
  let t = Math.ceil((range.start + offset) / HOUR) * HOUR - offset;
  if (zoneParts(t, zone).minute !== 0) t += HOUR - zoneParts(t, zone).minute * 60_000;
  const hours: AxisHour[] = [];
  const midnights: number[] = [];
  for (; t <= range.end; t += HOUR) {
    const p = zoneParts(t, zone);
    if (p.minute !== 0) continue;
    const midnight = p.hour === 0;
    if (midnight) midnights.push(t);
    if (p.hour % step === 0) hours.push({ at: t, left: pct(t), label: step < 24 ? formatClock(t, zone) : "", midnight });
  }
  const starts = [range.start, ...midnights.filter((m) => m > range.start && m < range.end)];
  const days = starts.map((at, i) => {
    const end = starts[i + 1] ?? range.end;
    return { at, left: pct(at), width: pct(end) - pct(at), label: formatDay(at, zone) };
  });
  return { days, hours, stepHours: step };
}

/** Keyboard steps on the timeline's start: arrows by the hour, Shift+arrows by 15 minutes, Page keys by a day. */
export function keyStep(key: string, shift: boolean): number | null {
  const unit = shift ? 15 * 60_000 : HOUR;
  switch (key) {
    case "ArrowRight":
    case "ArrowUp":
      return unit;
    case "ArrowLeft":
    case "ArrowDown":
      return -unit;
    case "PageUp":
      return 24 * HOUR;
    case "PageDown":
      return -24 * HOUR;
    default:
      return null;
  }
}

/** The zoom levels: how many times the track's width is stretched (the page scrolls it sideways). */
export const ZOOMS = [1, 2, 4, 8, 16];

/** A GPU track's state in words (its accessible label): the bookings in range and, among them, how many are
 * preemptible work that a booking can take after its notice (yielding capacity, not booked for good). */
export function trackStatus(segments: { yielding?: boolean }[]): string {
  if (segments.length === 0) return "free";
  const yielding = segments.filter((s) => s.yielding).length;
  const firm = segments.length - yielding;
  const parts: string[] = [];
  if (firm) parts.push(`${firm} booking(s) in range`);
  if (yielding) parts.push(`${yielding} preemptible (yielding capacity)`);
  return parts.join(", ");
}
