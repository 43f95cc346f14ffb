import { describe, expect, it } from "vitest";

import { compare, currentMonth, formatProfiling, formatShare } from "./efficiency";

describe("efficiency helpers", () => {
  it("names the current UTC month", () => {
    expect(currentMonth(new Date(Date.UTC(2026, 10, 30, 23, 59)))).toBe("2026-11");
  });

  it("shows shares as percentages and unknown as a dash", () => {
    expect(formatShare(0.1667)).toBe("16.7%");
    expect(formatShare(null)).toBe("–");
  });

  it("says which way a figure moved, by which way is good", () => {
    expect(compare(72, 60, { higherIsBetter: true })).toBe("12.0 points better");
    expect(compare(0.3, 0.1, { higherIsBetter: false, scale: 100 })).toBe("20.0 points worse");
    expect(compare(50, 50, { higherIsBetter: true })).toBe("the same");
    expect(compare(null, 50, { higherIsBetter: true })).toBe("no comparison");
  });
});

describe("formatProfiling", () => {
  it("shows a profiling reading, marks a partial one and says not measured, never 0%, where there is none", () => {
    expect(formatProfiling(42.25, "measured")).toBe("42.3%");
    expect(formatProfiling(80, "partly measured")).toBe("80.0% (part)");
    expect(formatProfiling(null, "not measured")).toBe("not measured");
    expect(formatProfiling(0, "not measured")).toBe("not measured");
  });
});
