// What the reservation pages say about a reservation's times: tenses that follow the clock, "held" only
// while a GPU is held, and when a finished one was over.

import type { Allocation, Reservation } from "../api/types";
import { formatDateTime, formatRelative } from "./format";

export const FINAL_STATES = ["completed", "cancelled", "failed", "interrupted"];

/** When it was over: the end of its window, or, cancelled before that, when it was cancelled. */
export function endedAt(r: Pick<Reservation, "updated_at" | "ends_at">): string {
  return Date.parse(r.updated_at) < Date.parse(r.ends_at) ? r.updated_at : r.ends_at;
}

/** "started 6 min ago, ends in 54 min": the tense follows `now`, which the caller keeps moving (useNow). */
export function whenText(r: Pick<Reservation, "state" | "starts_at" | "ends_at" | "updated_at" | "cost">, now: number): string {
  const start = Date.parse(r.starts_at);
  const over = FINAL_STATES.includes(r.state);
  if (over && r.cost.elapsed_seconds === 0 && Date.parse(r.updated_at) <= start) {
    return `${r.state} ${formatRelative(r.updated_at, now)}, before its window opened`;
  }
  const started = `${start <= now ? "started" : "starts"} ${formatRelative(r.starts_at, now)}`;
  const ended = `${Date.parse(r.ends_at) <= now || over ? "ended" : "ends"} ${formatRelative(r.ends_at, now)}`;
  return `${started}, ${ended}`;
}

/** "yes" only while the GPU is held now: before the window it is booked, not held. */
export function heldText(a: Pick<Allocation, "active" | "released_at" | "starts_at" | "ends_at">, now: number): string {
  if (a.released_at) return `released ${formatRelative(a.released_at, now)}`;
  if (!a.active) return "no";
  if (Date.parse(a.starts_at) > now) return `booked from ${formatDateTime(a.starts_at)}`;
  if (Date.parse(a.ends_at) <= now) return `until ${formatDateTime(a.ends_at)}`;
  return "yes";
}
