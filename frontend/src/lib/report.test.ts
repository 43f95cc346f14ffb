import { describe, expect, it } from "vitest";

import { explainMoney, moneyByReservation, reportRange, type LedgerLine } from "./report";

const line = (id: number, kind: string, amount: string, reservation: string | null = "r1"): LedgerLine => ({
  id, kind, amount, reservation, reason: "", actor_label: "system", created_at: "2026-12-01T10:00:00Z",
});

describe("report", () => {
  it("dates become UTC midnights", () => {
    expect(reportRange("2026-12-01", "2026-12-02")).toEqual({ start: "2026-12-01T00:00:00Z", end: "2026-12-02T00:00:00Z" });
  });

  it("explains hold, release and charge in plain words", () => {
    const [m] = moneyByReservation([line(1, "hold", "-4"), line(2, "release", "4"), line(3, "charge", "-1.5"), line(4, "grant", "10", null)]);
    expect(m).toEqual({ reservation: "r1", held: 4, released: 4, charged: 1.5, refunded: 0 });
    expect(explainMoney(m)).toBe(
      "When it was booked (or extended), 4 credits were held for its whole window. When it ended, the hold was released in full (4 credits back) and 1.5 credits were charged for the time its container ran. Net cost: 1.5 credits.",
    );
  });

  it("a reservation still running says its hold stays until it ends", () => {
    const [m] = moneyByReservation([line(1, "hold", "-2")]);
    expect(explainMoney(m)).toMatch(/has not ended yet/);
  });
});
