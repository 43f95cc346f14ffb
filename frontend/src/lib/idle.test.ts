import { describe, expect, it } from "vitest";

import type { IdleReclamation } from "../api/types";
import { idleWarningOpen } from "./idle";

const warned: IdleReclamation = {
  state: "warned",
  warned_at: "2026-12-01T10:30:00Z",
  util_percent: 1.2,
  threshold_percent: "5.00",
  idle_minutes: 30,
  booked_ends_at: "2026-12-01T14:00:00Z",
  cut_ends_at: "2026-12-01T10:45:00Z",
  kept_at: null,
  kept_by: null,
  reclaimed_at: null,
  reclaimed_gpu_hours: 6.5,
};

describe("idleWarningOpen", () => {
  it("is open during the grace only", () => {
    expect(idleWarningOpen(warned, Date.parse("2026-12-01T10:31:00Z"))).toBe(true);
    expect(idleWarningOpen(warned, Date.parse("2026-12-01T10:45:00Z"))).toBe(false);
  });
  it("is closed when kept, reclaimed or never warned", () => {
    const now = Date.parse("2026-12-01T10:31:00Z");
    expect(idleWarningOpen({ ...warned, state: "kept" }, now)).toBe(false);
    expect(idleWarningOpen({ ...warned, state: "reclaimed" }, now)).toBe(false);
    expect(idleWarningOpen(null, now)).toBe(false);
  });
});
