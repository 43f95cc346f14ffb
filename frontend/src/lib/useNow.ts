import { useEffect, useState } from "react";

/**
 * The current time, refreshed every `intervalMs`, for text relative to now ("in 3 min", "12 min ago"): a
 * component that shows one re-renders as the clock moves, not only when its data changes.
 */
export function useNow(intervalMs = 15_000): number {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    const timer = window.setInterval(() => setNow(Date.now()), intervalMs);
    return () => window.clearInterval(timer);
  }, [intervalMs]);
  return now;
}
