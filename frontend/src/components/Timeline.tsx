import { Group, Stack, Text } from "@mantine/core";
import type { KeyboardEvent, MouseEvent } from "react";

import type { TimelineGpu } from "../api/types";
import { instantAt, placeSegment, ticks, type Range } from "../lib/timeline";
import { SimulatedBadge } from "./Badges";

function tickLabel(t: number, span: number): string {
  const d = new Date(t);
  const midnight = d.getHours() === 0 && d.getMinutes() === 0;
  // Days at midnight on long ranges, clock times otherwise, so no two ticks read the same.
  if (span > 2 * 86_400_000 && midnight) return d.toLocaleDateString("en-GB", { weekday: "short", day: "2-digit", month: "short" });
  return d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });
}

/** GPUs down the side, time across; grey is someone else's booking, blue is yours, the yellow box your pick. */
export function Timeline(props: {
  range: Range;
  gpus: TimelineGpu[];
  simulatedHosts: Set<string>;
  pick?: Range | null;
  onPick?: (start: number) => void;
}) {
  const { range, gpus } = props;
  const span = range.end - range.start;
  const marks = ticks(range, 7);
  const now = placeSegment(range, Date.now(), Date.now() + 1);
  const pick = props.pick ? placeSegment(range, props.pick.start, props.pick.end) : null;

  function click(e: MouseEvent<HTMLDivElement>) {
    if (!props.onPick) return;
    const rect = e.currentTarget.getBoundingClientRect();
    props.onPick(instantAt(range, (e.clientX - rect.left) / rect.width));
  }

  // The keyboard way to the same pick: arrows move the window's start by an hour (six on long ranges). The
  // start is the same for every GPU, so one track is a tab stop, not one per GPU.
  function key(e: KeyboardEvent<HTMLDivElement>) {
    if (!props.onPick) return;
    const step = span > 2 * 86_400_000 ? 6 * 3_600_000 : 3_600_000;
    const from = props.pick?.start ?? Math.max(Date.now(), range.start);
    const moves: Record<string, number> = {
      ArrowRight: from + step,
      ArrowUp: from + step,
      ArrowLeft: from - step,
      ArrowDown: from - step,
      Home: range.start,
      End: range.end - step,
      Enter: from,
      " ": from,
    };
    if (!(e.key in moves)) return;
    e.preventDefault();
    props.onPick(Math.min(Math.max(moves[e.key], range.start), range.end));
  }
  const pickText = props.pick
    ? `window starts ${new Date(props.pick.start).toLocaleString("en-GB", { dateStyle: "medium", timeStyle: "short" })}`
    : "no window picked";

  let lastServer = "";
  let first = true;
  return (
    <Stack gap={0} data-testid="timeline">
      <div className="tl-row">
        <span />
        <div className="tl-ticks" aria-hidden>
          {marks.map((m) => (
            <span key={m.at} style={{ left: `${m.left}%` }}>
              {tickLabel(m.at, span)}
            </span>
          ))}
        </div>
      </div>
      {gpus.map((g) => {
        const header = g.server !== lastServer;
        lastServer = g.server;
        const busyCount = g.segments.length;
        const stop = first && !!props.onPick;
        first = false;
        return (
          <div key={g.gpu}>
            {header && (
              <Group gap="xs" mt="xs" mb={2}>
                <Text size="sm" fw={600}>
                  {g.server}
                </Text>
                <Text size="xs" c="dimmed">
                  {g.gpu_model}
                </Text>
                {props.simulatedHosts.has(g.server) && <SimulatedBadge />}
              </Group>
            )}
            <div className="tl-row">
              <span className="tl-label" title={g.gpu}>
                GPU {g.index}
              </span>
              <div
                className="tl-track"
                onClick={click}
                onKeyDown={stop ? key : undefined}
                tabIndex={stop ? 0 : undefined}
                role={stop ? "slider" : undefined}
                aria-valuemin={stop ? range.start : undefined}
                aria-valuemax={stop ? range.end : undefined}
                aria-valuenow={stop ? (props.pick?.start ?? range.start) : undefined}
                aria-valuetext={stop ? `${pickText}; arrow keys move it by the hour` : undefined}
                aria-label={`${g.server} GPU ${g.index}: ${busyCount ? `${busyCount} booking(s) in range` : "free"}`}
                data-testid={stop ? "timeline-pick" : undefined}
              >
                {g.segments.map((s, i) => {
                  const p = placeSegment(range, Date.parse(s.starts_at), Date.parse(s.ends_at));
                  if (!p) return null;
                  return (
                    <div
                      key={i}
                      className={`tl-seg ${s.mine ? "mine" : "busy"}`}
                      style={{ left: `${p.left}%`, width: `${p.width}%` }}
                      title={s.mine ? `${s.project}: ${s.starts_at} – ${s.ends_at}` : "booked"}
                    >
                      {s.mine ? s.project : ""}
                    </div>
                  );
                })}
                {pick && <div className="tl-seg pick" style={{ left: `${pick.left}%`, width: `${pick.width}%` }} />}
                {now && <div className="tl-now" style={{ left: `${now.left}%` }} />}
              </div>
            </div>
          </div>
        );
      })}
    </Stack>
  );
}
