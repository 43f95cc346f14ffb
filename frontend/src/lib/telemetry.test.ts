import { describe, expect, it } from "vitest";

import { appendSample, mergeSeries } from "./telemetry";
import { reportRange } from "./report";

describe("telemetry history", () => {
  it("keeps a sample once, by its own timestamp, and bounds the history", () => {
    let h = appendSample([], { t: 1000, u: 1 });
    const same = appendSample(h, { t: 1000, u: 2 });
    expect(same).toBe(h);
    h = appendSample(h, { t: 2000, u: 3 }, 1);
    expect(h).toEqual([{ t: 2000, u: 3 }]);
  });

  it("merges GPUs into rows by time and skips missing fields", () => {
    const rows = mergeSeries(
      { "a/0": [{ t: 1000, u: 10 }, { t: 2000, u: 20 }], "a/1": [{ t: 1200, u: 5 }, { t: 3000, p: 1 }] },
      "u",
    );
    expect(rows).toEqual([{ t: 1000, "a/0": 10, "a/1": 5 }, { t: 2000, "a/0": 20 }]);
  });
});

describe("reportRange", () => {
  it("turns form dates into UTC midnights the report accepts", () => {
    expect(reportRange("2025-03-01", "2025-04-01")).toEqual({ start: "2025-03-01T00:00:00Z", end: "2025-04-01T00:00:00Z" });
  });

  it("passes anything else through so the server names the field", () => {
    expect(reportRange("", "x").start).toBe("");
  });
});
