import { afterEach, describe, expect, it } from "vitest";

import {
  formatClock,
  formatDateTime,
  formatDay,
  fromZoneWall,
  parseDateTime,
  setZoneMode,
  shownZone,
  subscribeZone,
  viewerZone,
  zoneLabel,
  zoneOffset,
  zoneParts,
} from "./format";

const BERLIN = "Europe/Berlin";
const LA = "America/Los_Angeles";
const noonUtc = Date.parse("2026-12-01T12:00:00Z");

afterEach(() => setZoneMode("viewer"));

describe("the one date format", () => {
  it("reads the same in every zone's own wall time", () => {
    expect(formatDateTime("2026-12-01T12:00:00Z", "UTC")).toBe("01 Dec 2026, 12:00");
    expect(formatDateTime("2026-12-01T12:00:00Z", BERLIN)).toBe("01 Dec 2026, 13:00");
    expect(formatDateTime(noonUtc, LA)).toBe("01 Dec 2026, 04:00");
    expect(formatDateTime("2026-09-05T23:30:00Z", BERLIN)).toBe("06 Sep 2026, 01:30"); // never "Sept"
    expect(formatDateTime(null)).toBe("–");
    expect(formatDateTime("not a date")).toBe("not a date");
  });

  it("days and clock times for the axis", () => {
    expect(formatDay(noonUtc, BERLIN)).toBe("Tue 01 Dec");
    expect(formatDay(Date.parse("2026-12-01T23:30:00Z"), BERLIN)).toBe("Wed 02 Dec");
    expect(formatClock(noonUtc, LA)).toBe("04:00");
  });

  it("parses what it writes, as a wall time in the zone shown", () => {
    for (const zone of ["UTC", BERLIN, LA, "Asia/Kolkata"]) {
      const text = formatDateTime(noonUtc, zone);
      expect(parseDateTime(text, zone)).toBe(noonUtc);
    }
    expect(parseDateTime("01 Dec 2026, 12:00", BERLIN)).toBe(Date.parse("2026-12-01T11:00:00Z"));
    expect(parseDateTime("1 december 2026 9:05", "UTC")).toBe(Date.parse("2026-12-01T09:05:00Z"));
    expect(parseDateTime("12/01/2026, 12:00 PM", "UTC")).toBeNull();
    expect(parseDateTime("31 Feb 2026, 12:00", "UTC")).toBeNull();
    expect(parseDateTime("01 Dec 2026, 24:00", "UTC")).toBeNull();
  });

  it("offsets follow daylight saving time", () => {
    expect(zoneOffset(Date.parse("2026-01-15T12:00:00Z"), BERLIN)).toBe(3_600_000);
    expect(zoneOffset(Date.parse("2026-07-15T12:00:00Z"), BERLIN)).toBe(7_200_000);
    expect(zoneOffset(Date.parse("2026-07-15T12:00:00Z"), LA)).toBe(-7 * 3_600_000);
    // 29 Mar 2026: Berlin's clocks go from 02:00 to 03:00; 03:30 that day is 01:30 UTC.
    expect(fromZoneWall(2026, 3, 29, 3, 30, BERLIN)).toBe(Date.parse("2026-03-29T01:30:00Z"));
    expect(fromZoneWall(2026, 3, 28, 3, 30, BERLIN)).toBe(Date.parse("2026-03-28T02:30:00Z"));
    expect(zoneParts(Date.parse("2026-03-29T01:30:00Z"), BERLIN).hour).toBe(3);
  });

  it("names the zone with its offset", () => {
    expect(zoneLabel("UTC")).toBe("UTC");
    expect(zoneLabel(BERLIN, noonUtc)).toBe("Europe/Berlin (UTC+01:00)");
    expect(zoneLabel(LA, noonUtc)).toBe("America/Los_Angeles (UTC−08:00)");
    expect(zoneLabel("Asia/Kolkata", noonUtc)).toBe("Asia/Kolkata (UTC+05:30)");
  });
});

describe("the zone setting", () => {
  it("switches between the viewer's zone and UTC and tells subscribers", () => {
    let calls = 0;
    const stop = subscribeZone(() => calls++);
    setZoneMode("utc");
    expect(shownZone()).toBe("UTC");
    expect(formatDateTime(noonUtc)).toBe("01 Dec 2026, 12:00");
    setZoneMode("viewer");
    expect(shownZone()).toBe(viewerZone());
    stop();
    setZoneMode("utc");
    expect(calls).toBe(2);
  });
});
