import { describe, expect, it } from "vitest";

import { formatCredits, formatDuration, formatHours, formatMiB, formatPercent, formatRelative, fromLocalInput, heatColor, shortUuid, toLocalInput } from "./format";

describe("format", () => {
  it("credits keep at most two decimals and accept decimal strings", () => {
    expect(formatCredits("1234.5678")).toBe("1,234.57");
    expect(formatCredits(null)).toBe("–");
    expect(formatCredits("abc")).toBe("abc");
  });

  it("memory in MiB and GiB", () => {
    expect(formatMiB(81920)).toBe("80 GiB");
    expect(formatMiB(40960 + 512)).toBe("40.5 GiB");
    expect(formatMiB(512)).toBe("512 MiB");
    expect(formatMiB(null)).toBe("–");
  });

  it("percent and hours", () => {
    expect(formatPercent(42.6)).toBe("43%");
    expect(formatPercent(undefined)).toBe("–");
    expect(formatHours(0.5)).toBe("30 min");
    expect(formatHours(2.333333)).toBe("2.33 h");
  });

  it("relative times in both directions", () => {
    const now = Date.parse("2025-06-01T12:00:00Z");
    expect(formatRelative("2025-06-01T15:00:00Z", now)).toBe("in 3 h");
    expect(formatRelative("2025-06-01T11:48:00Z", now)).toBe("12 min ago");
    expect(formatRelative("2025-06-05T12:00:00Z", now)).toBe("in 4 d");
    expect(formatRelative("2025-06-01T12:00:10Z", now)).toBe("now");
  });

  it("datetime-local round trip keeps the minute", () => {
    const d = new Date(2025, 0, 2, 3, 4);
    expect(toLocalInput(d)).toBe("2025-01-02T03:04");
    expect(fromLocalInput(toLocalInput(d))!.getTime()).toBe(d.getTime());
    expect(fromLocalInput("")).toBeNull();
  });

  it("short uuids and heat colours", () => {
    expect(shortUuid("GPU-12345678-aaaa-bbbb")).toBe("GPU-12345678…");
    expect(heatColor(0)).toBe("hsl(120 70% 28%)");
    expect(heatColor(100)).toBe("hsl(0 70% 28%)");
    expect(heatColor(250)).toBe("hsl(0 70% 28%)");
    expect(heatColor(null)).toContain("gray");
  });

  it("durations", () => {
    expect(formatDuration(45)).toBe("45 s");
    expect(formatDuration(360)).toBe("6 min");
    expect(formatDuration(2 * 3600 + 300)).toBe("2 h 5 min");
    expect(formatDuration(3600)).toBe("1 h");
    expect(formatDuration(3 * 86400 + 4 * 3600)).toBe("3 d 4 h");
    expect(formatDuration(-1)).toBe("–");
  });
});
