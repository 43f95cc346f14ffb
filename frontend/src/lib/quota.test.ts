import { describe, expect, it } from "vitest";

import { hoursBetween, quotaEffect } from "./quota";

describe("quotaEffect", () => {
  it("charges hours x count x billing weight against the balance", () => {
    const e = quotaEffect({ hours: 2, gpuCount: 4, billingWeight: "1.5", balance: "100" });
    expect(e.creditsNeeded).toBe(12);
    expect(e.balanceAfter).toBe(88);
    expect(e.fits).toBe(true);
    expect(e.problems).toEqual([]);
  });

  it("refuses a booking dearer than the balance and says by how much", () => {
    const e = quotaEffect({ hours: 10, gpuCount: 8, billingWeight: "2", balance: "100" });
    expect(e.creditsNeeded).toBe(160);
    expect(e.fits).toBe(false);
    expect(e.problems[0]).toBe("Needs 160 credits but the project has 100.");
  });

  it("a booking costing exactly the balance fits", () => {
    expect(quotaEffect({ hours: 1, gpuCount: 1, billingWeight: 5, balance: 5 }).fits).toBe(true);
  });

  it("does not show float noise in credits", () => {
    const e = quotaEffect({ hours: 0.1, gpuCount: 3, billingWeight: "1", balance: "1" });
    expect(e.creditsNeeded).toBe(0.3);
    expect(e.balanceAfter).toBe(0.7);
  });

  it("names the concurrent GPU limit and the longest booking", () => {
    const e = quotaEffect({ hours: 50, gpuCount: 9, billingWeight: 0, balance: 1000, maxConcurrentGpus: 8, maxReservationHours: "48" });
    expect(e.problems).toEqual([
      "The project may hold at most 8 GPUs at once.",
      "A reservation may last at most 48 hours.",
    ]);
  });

  it("an empty or reversed window and zero GPUs are problems, never negative credits", () => {
    const e = quotaEffect({ hours: -1, gpuCount: 0, billingWeight: 1, balance: 10 });
    expect(e.creditsNeeded).toBe(0);
    expect(e.problems).toContain("The window must end after it starts.");
    expect(e.problems).toContain("Ask for at least one GPU.");
  });

  it("hoursBetween measures the window", () => {
    expect(hoursBetween(new Date("2025-01-01T00:00:00Z"), new Date("2025-01-01T01:30:00Z"))).toBe(1.5);
  });
});
