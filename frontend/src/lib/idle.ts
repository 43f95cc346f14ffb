import type { IdleReclamation } from "../api/types";

/** Whether the "keep it" banner shows: a warning still open, and its grace not over yet. */
export function idleWarningOpen(idle: IdleReclamation | null | undefined, now: number = Date.now()): boolean {
  return !!idle && idle.state === "warned" && Date.parse(idle.cut_ends_at) > now;
}
