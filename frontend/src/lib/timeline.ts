// Layout math for the availability Gantt: where a segment sits on a track, and where the ticks go.

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

const HOUR = 3_600_000;
const STEPS = [1, 2, 3, 6, 12, 24, 48, 168].map((h) => h * HOUR);

/** Tick marks aligned to whole steps (in UTC) so that at most `maxTicks` fit; each with its percent offset. */
export function ticks(range: Range, maxTicks = 8): { at: number; left: number }[] {
  const span = range.end - range.start;
  if (span <= 0) return [];
  const step = STEPS.find((s) => span / s <= maxTicks) ?? STEPS[STEPS.length - 1];
  const first = Math.ceil(range.start / step) * step;
  const out: { at: number; left: number }[] = [];
  for (let t = first; t <= range.end; t += step) out.push({ at: t, left: ((t - range.start) / span) * 100 });
  return out;
}

/** Which instant a click at `fraction` (0..1) of the track means, snapped down to `snapMs`. */
export function instantAt(range: Range, fraction: number, snapMs = HOUR): number {
  const f = Math.min(1, Math.max(0, fraction));
  const t = range.start + f * (range.end - range.start);
  return Math.floor(t / snapMs) * snapMs;
}
