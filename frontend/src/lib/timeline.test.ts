import { describe, expect, it } from "vitest";

import { axis, freeGaps, instantAt, keyStep, placeSegment, trackStatus } from "./timeline";

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

describe("instantAt", () => {
  it("maps a click fraction to an hour, clamped to the range", () => {
    expect(instantAt(range, 0.55)).toBe(5 * H);
    expect(instantAt(range, -1)).toBe(0);
    expect(instantAt(range, 2)).toBe(10 * H);
    // A zone half an hour ahead of UTC snaps to its own whole hours; 15-minute snaps when zoomed in.
    expect(instantAt(range, 0.52, H, H / 2)).toBe(4.5 * H);
    expect(instantAt(range, 0.58, H / 4)).toBe(5.75 * H);
  });
});

describe("axis in the zone shown", () => {
  const day = 24 * H;
  // 1 Dec 2026 00:00 UTC, as the page's range starts at a whole UTC hour.
  const start = Date.parse("2026-12-01T00:00:00Z");

  it("labels a 7-day range with seven dated days and whole hours of Berlin, not 01:00 seven times", () => {
    const a = axis({ start, end: start + 7 * day }, 700, "Europe/Berlin");
    expect(a.stepHours).toBe(12);
    const labels = a.days.map((d) => d.label);
    expect(new Set(labels).size).toBe(labels.length);
    expect(labels.slice(0, 3)).toEqual(["Tue 01 Dec", "Wed 02 Dec", "Thu 03 Dec"]);
    // Days break at Berlin's midnight (23:00 UTC), so the first band is the hour from 01:00 to midnight.
    expect(a.days[1].at).toBe(Date.parse("2026-12-01T23:00:00Z"));
    expect(a.hours.every((h) => h.label === "00:00" || h.label === "12:00")).toBe(true);
    expect(a.hours.filter((h) => h.midnight).length).toBe(7);
  });

  it("the same range in UTC and in Los Angeles", () => {
    const utc = axis({ start, end: start + 3 * day }, 700, "UTC");
    expect(utc.days.map((d) => d.label)).toEqual(["Tue 01 Dec", "Wed 02 Dec", "Thu 03 Dec"]);
    expect(utc.hours[0]).toMatchObject({ at: start, label: "00:00", midnight: true });
    const la = axis({ start, end: start + 3 * day }, 700, "America/Los_Angeles");
    expect(la.days[0].label).toBe("Mon 30 Nov");
    expect(la.days[1].at).toBe(Date.parse("2026-12-01T08:00:00Z"));
  });

  it("finer steps when the track is wider (zoomed), midnight lines only when it is narrow", () => {
    const range = { start, end: start + 3 * day };
    expect(axis(range, 700, "UTC").stepHours).toBe(6);
    expect(axis(range, 700 * 8, "UTC").stepHours).toBe(1);
    const narrow = axis({ start, end: start + 7 * day }, 250, "UTC");
    expect(narrow.stepHours).toBe(24);
    expect(narrow.hours.every((h) => h.label === "" && h.midnight)).toBe(true);
  });

  it("hour lines sit on the zone's whole hours where it is half an hour off UTC", () => {
    const a = axis({ start, end: start + day }, 1000, "Asia/Kolkata");
    expect(a.hours[0].at).toBe(Date.parse("2026-12-01T00:30:00Z"));
    expect(a.hours[0].label).toBe("06:00");
  });

  it("keeps the gridlines in the zone across a DST change", () => {
    const s = Date.parse("2026-03-28T23:00:00Z"); // Berlin midnight, the night clocks go forward
    const a = axis({ start: s, end: s + day }, 2400, "Europe/Berlin");
    expect(a.stepHours).toBe(1);
    expect(a.hours.map((h) => h.label)).not.toContain("02:00");
    // That day has 23 hours, so 24 hours from its midnight reach an hour into the next.
    expect(a.days.map((d) => d.label)).toEqual(["Sun 29 Mar", "Mon 30 Mar"]);
    expect(a.days[1].at).toBe(Date.parse("2026-03-29T22:00:00Z"));
  });
});

describe("keyboard steps", () => {
  it("hours on the arrows, quarters with Shift, days on the page keys", () => {
    expect(keyStep("ArrowRight", false)).toBe(H);
    expect(keyStep("ArrowLeft", true)).toBe(-H / 4);
    expect(keyStep("PageUp", false)).toBe(24 * H);
    expect(keyStep("a", false)).toBeNull();
  });
});

describe("trackStatus", () => {
  it("tells preemptible work apart from bookings", () => {
    expect(trackStatus([])).toBe("free");
    expect(trackStatus([{}, { yielding: false }])).toBe("2 booking(s) in range");
    expect(trackStatus([{ yielding: true }])).toBe("1 preemptible (yielding capacity)");
    expect(trackStatus([{}, { yielding: true }])).toBe("1 booking(s) in range, 1 preemptible (yielding capacity)");
  });
});
