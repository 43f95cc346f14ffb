import { describe, expect, it } from "vitest";

import type { ReservationCost, ReservationState } from "../api/types";
import { endedAt, heldText, whenText } from "./reservation";

const cost = (elapsed: number): ReservationCost => ({
  credits_per_hour: "2",
  booked_credits: "2",
  elapsed_seconds: elapsed,
  gpu_hours: "0",
  credits_so_far: "0",
  credits_charged: null,
});
const at = (iso: string) => Date.parse(iso);

describe("reservation times", () => {
  const r = {
    state: "running" as ReservationState,
    starts_at: "2025-03-01T10:00:00Z",
    ends_at: "2025-03-01T11:00:00Z",
    updated_at: "2025-03-01T10:00:05Z",
    cost: cost(60),
  };

  it("moves from 'starts' to 'started' and from 'ends' to 'ended' as the clock moves", () => {
    expect(whenText(r, at("2025-03-01T09:30:00Z"))).toBe("starts in 30 min, ends in 2 h");
    expect(whenText(r, at("2025-03-01T10:06:00Z"))).toBe("started 6 min ago, ends in 54 min");
    expect(whenText({ ...r, state: "completed" as ReservationState }, at("2025-03-01T11:05:00Z"))).toBe("started 1 h ago, ended 5 min ago");
  });

  it("says a finished reservation ended even within the minute", () => {
    expect(whenText({ ...r, state: "completed" as ReservationState }, at("2025-03-01T11:00:10Z"))).toBe("started 1 h ago, ended now");
  });

  it("says when a reservation was cancelled before its window", () => {
    const cancelled = { ...r, state: "cancelled" as ReservationState, updated_at: "2025-03-01T09:00:00Z", cost: cost(0) };
    expect(whenText(cancelled, at("2025-03-01T09:10:00Z"))).toBe("cancelled 10 min ago, before its window opened");
    expect(endedAt(cancelled)).toBe("2025-03-01T09:00:00Z");
    expect(endedAt({ ...r, updated_at: "2025-03-01T11:00:03Z" })).toBe("2025-03-01T11:00:00Z");
  });
});

describe("held", () => {
  const a = { active: true, released_at: null, starts_at: "2025-03-01T10:00:00Z", ends_at: "2025-03-01T11:00:00Z" };

  it("is 'yes' only inside the window", () => {
    expect(heldText(a, at("2025-03-01T09:00:00Z"))).toMatch(/^booked from /);
    expect(heldText(a, at("2025-03-01T10:30:00Z"))).toBe("yes");
    expect(heldText(a, at("2025-03-01T11:30:00Z"))).toMatch(/^until /);
    expect(heldText({ ...a, active: false, released_at: "2025-03-01T10:40:00Z" }, at("2025-03-01T10:50:00Z"))).toBe(
      "released 10 min ago",
    );
    expect(heldText({ ...a, active: false }, at("2025-03-01T10:30:00Z"))).toBe("no");
  });
});
