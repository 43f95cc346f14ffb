import { describe, expect, it } from "vitest";

import { freeGaps, instantAt, placeSegment, ticks } from "./timeline";

const H = 3_600_000;
const range = { start: 0, end: 10 * H };

describe("placeSegment", () => {
  it("places a segment inside the range as percentages", () => {
    expect(placeSegment(range, 2 * H, 4 * H)).toEqual({ left: 20, width: 20, clippedStart: false, clippedEnd: false });
  });

  it("clips a segment that starts before and ends after the range", () => {
    expect(placeSegment(range, -5 * H, 15 * H)).toEqual({ left: 0, width: 100, clippedStart: true, clippedEnd: true });
  });

  it("returns null for segments outside the range or empty", () => {
    expect(placeSegment(range, 10 * H, 12 * H)).toBeNull();
    expect(placeSegment(range, -2 * H, 0)).toBeNull();
    expect(placeSegment(range, 3 * H, 3 * H)).toBeNull();
    expect(placeSegment({ start: 5, end: 5 }, 0, 10)).toBeNull();
  });
});

describe("freeGaps", () => {
  it("finds the gaps between overlapping, unsorted bookings", () => {
    const gaps = freeGaps(range, [
      { start: 6 * H, end: 8 * H },
      { start: 1 * H, end: 3 * H },
      { start: 2 * H, end: 4 * H },
    ]);
    expect(gaps).toEqual([
      { start: 0, end: 1 * H },
      { start: 4 * H, end: 6 * H },
      { start: 8 * H, end: 10 * H },
    ]);
  });

  it("a fully booked track has no gaps, an empty one is all gap", () => {
    expect(freeGaps(range, [{ start: -H, end: 11 * H }])).toEqual([]);
    expect(freeGaps(range, [])).toEqual([range]);
  });
});

describe("ticks", () => {
  it("chooses a step so that at most maxTicks fit, aligned to whole hours", () => {
    const t = ticks({ start: 0.5 * H, end: 24.5 * H }, 8);
    expect(t.length).toBeLessThanOrEqual(8);
    expect(t.every((x) => x.at % (3 * H) === 0)).toBe(true);
    expect(t[0].at).toBe(3 * H);
  });

  it("offsets are percentages of the range", () => {
    const t = ticks({ start: 0, end: 4 * H }, 8);
    expect(t.map((x) => x.left)).toEqual([0, 25, 50, 75, 100]);
  });
});

describe("instantAt", () => {
  it("maps a click fraction to an hour, clamped to the range", () => {
    expect(instantAt(range, 0.55)).toBe(5 * H);
    expect(instantAt(range, -1)).toBe(0);
    expect(instantAt(range, 2)).toBe(10 * H);
  });
});
