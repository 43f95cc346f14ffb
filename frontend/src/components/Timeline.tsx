import { ActionIcon, Badge, Group, Text, VisuallyHidden } from "@mantine/core";
import { useElementSize } from "@mantine/hooks";
import { useEffect, useRef, useState, type KeyboardEvent, type MouseEvent } from "react";

import type { TimelineGpu, TimelineSegment } from "../api/types";
import { formatDateTime, zoneLabel, zoneOffset } from "../lib/format";
import { axis, instantAt, keyStep, placeSegment, trackStatus, ZOOMS, type Range } from "../lib/timeline";
import { SimulatedBadge } from "./Badges";
import { useShownZone } from "./ZoneToggle";

const HOUR = 3_600_000;
const REASON_TEXT: Record<string, string> = {
  draining: "draining",
  maintenance: "in maintenance",
  offline: "offline",
  commissioning: "commissioning",
  unhealthy: "unhealthy",
};

function unavailableText(u: NonNullable<TimelineGpu["unavailable"]>): string {
  return `Not bookable: ${REASON_TEXT[u.reason] ?? u.reason}${u.detail ? ` (${u.detail})` : ""}`;
}

/** A segment's words: whose it is and, for preemptible work, that a booking can take it after notice. */
function segmentTitle(s: TimelineSegment, when: string): string {
  const who = s.mine ? `${s.project}` : "Booked by another project";
  return s.yielding ? `${who}, preemptible (yielding capacity: a booking can take it after its notice): ${when}` : `${who}: ${when}`;
}

/**
 * GPUs down the side, time across, in the zone shown: a row of dates and hour gridlines on top; grey is
 * someone else's booking, blue yours, hatched capacity that cannot be booked now (with the reason), the
 * yellow box your window on the GPUs a booking would get. Zoom stretches the tracks (they scroll sideways).
 */
export function Timeline(props: {
  range: Range;
  gpus: TimelineGpu[];
  simulatedHosts: Set<string>;
  pick?: Range | null;
  /** UUIDs of the GPUs a booking of the window would get; the pick is drawn on those rows only. */
  pickGpus?: ReadonlySet<string>;
  /** What the window is, in words, for the slider's value and the announcement. */
  pickText?: string;
  onPick?: (start: number) => void;
}) {
  const { range, gpus } = props;
  const zone = useShownZone();
  const [zoom, setZoom] = useState(1);
  const { ref: sizeRef, width: boxWidth } = useElementSize();
  const scroller = useRef<HTMLDivElement | null>(null);
  const [announce, setAnnounce] = useState("");

  const narrow = boxWidth > 0 && boxWidth < 560;
  const labelPx = narrow ? 84 : 150;
  const trackPx = Math.max((boxWidth || 800) - labelPx - 8, 240) * zoom;
  const columns = `${labelPx}px ${trackPx}px`;
  const marks = axis(range, trackPx, zone);
  const now = Date.now();
  const nowAt = placeSegment(range, now, now + 1);
  const pick = props.pick ? placeSegment(range, props.pick.start, props.pick.end) : null;
  const downFrom = placeSegment(range, Math.max(now, range.start), range.end);
  const snap = trackPx / ((range.end - range.start) / HOUR) >= 120 ? HOUR / 4 : HOUR;

  // Keep the window (or now) in view when the zoom changes (only then: not on every pick).
  useEffect(() => {
    const el = scroller.current;
    if (!el) return;
    const at = props.pick?.start ?? now;
    const f = (at - range.start) / (range.end - range.start);
    el.scrollLeft = Math.max(0, labelPx + f * trackPx - el.clientWidth / 4);
  }, [zoom]);

  // After a pick, announce the window it set (the words arrive with the next render).
  useEffect(() => {
    if (announce && props.pickText) setAnnounce(props.pickText);
  }, [props.pickText]);

  function pickAt(t: number) {
    if (!props.onPick) return;
    props.onPick(t);
    setAnnounce(props.pickText ?? " "); // replaced by the new window's words on the next render
  }

  function click(e: MouseEvent<HTMLDivElement>) {
    const rect = e.currentTarget.getBoundingClientRect();
    pickAt(instantAt(range, (e.clientX - rect.left) / rect.width, snap, zoneOffset(range.start, zone)));
  }

  // The keyboard way to the same pick (one tab stop: the start is the same for every GPU). Arrows move the
  // start by an hour, Shift+arrows by 15 minutes, Page Up/Down by a day; Home is "now", End the range's end.
  function key(e: KeyboardEvent<HTMLDivElement>) {
    const from = Math.max(props.pick?.start ?? now, Date.now());
    const step = keyStep(e.key, e.shiftKey);
    let to: number | null = null;
    if (step !== null) to = from + step;
    else if (e.key === "Home") to = Date.now();
    else if (e.key === "End") to = range.end - HOUR;
    if (to === null) return;
    e.preventDefault();
    pickAt(Math.min(Math.max(to, Date.now()), range.end));
  }

  let lastServer = "";
  let first = true;
  return (
    <div data-testid="timeline" ref={sizeRef}>
      <Group justify="space-between" mb={4} gap="xs">
        <Text size="xs" data-testid="timeline-zone">
          Times in {zoneLabel(zone)}
        </Text>
        <Group gap={4} wrap="nowrap">
          <ActionIcon
            variant="default"
            size="sm"
            aria-label="Zoom out"
            disabled={zoom === ZOOMS[0]}
            onClick={() => setZoom(ZOOMS[Math.max(0, ZOOMS.indexOf(zoom) - 1)])}
          >
            −
          </ActionIcon>
          <Text size="xs" w={28} ta="center" data-testid="timeline-zoom" aria-live="polite">
            {zoom}×
          </Text>
          <ActionIcon
            variant="default"
            size="sm"
            aria-label="Zoom in"
            disabled={zoom === ZOOMS[ZOOMS.length - 1]}
            onClick={() => setZoom(ZOOMS[Math.min(ZOOMS.length - 1, ZOOMS.indexOf(zoom) + 1)])}
          >
            +
          </ActionIcon>
        </Group>
      </Group>
      <TimelineLegend />
      <div className="tl-scroll" ref={scroller}>
        <div className="tl-inner" style={{ width: labelPx + 8 + trackPx }}>
          <div className="tl-grid" style={{ left: labelPx + 8, width: trackPx }} aria-hidden>
            {marks.hours.map((h) => (
              <span key={h.at} className={h.midnight ? "tl-line day" : "tl-line"} style={{ left: `${h.left}%` }} />
            ))}
          </div>
          <div className="tl-row" style={{ gridTemplateColumns: columns }}>
            <span className="tl-label tl-sticky" />
            <div aria-hidden data-testid="timeline-axis">
              <div className="tl-days">
                {marks.days.map((d) => (
                  <span key={d.at} data-testid="axis-day" data-at={d.at} title={d.label} style={{ left: `${d.left}%`, width: `${d.width}%` }}>
                    {d.label}
                  </span>
                ))}
              </div>
              <div className="tl-ticks">
                {marks.hours
                  .filter((h) => h.label)
                  .map((h) => (
                    <span key={h.at} data-testid="axis-hour" data-at={h.at} style={{ left: `${h.left}%` }}>
                      {h.label}
                    </span>
                  ))}
              </div>
            </div>
          </div>
          {gpus.map((g) => {
            const header = g.server !== lastServer;
            lastServer = g.server;
            const stop = first && !!props.onPick;
            first = false;
            const serverDown = g.unavailable && g.unavailable.reason !== "unhealthy" ? g.unavailable : null;
            const drawPick = pick && props.pickGpus?.has(g.gpu);
            const status = g.unavailable ? unavailableText(g.unavailable) : trackStatus(g.segments);
            return (
              <div key={g.gpu} data-testid={`gpu-row-${g.server}-${g.index}`} data-unavailable={g.unavailable?.reason ?? ""}>
                {header && (
                  <Group gap="xs" mt="xs" mb={2} className="tl-sticky tl-server" wrap="wrap">
                    <Text size="sm" fw={600}>
                      {g.server}
                    </Text>
                    <Text size="xs" c="dimmed">
                      {g.gpu_model}
                    </Text>
                    {props.simulatedHosts.has(g.server) && <SimulatedBadge />}
                    {serverDown && (
                      <>
                        <Badge size="sm" color="dark" variant="outline" data-testid={`unavailable-${g.server}`}>
                          {REASON_TEXT[serverDown.reason] ?? serverDown.reason}
                        </Badge>
                        <Text size="xs">not bookable{serverDown.detail ? `: ${serverDown.detail}` : ""}</Text>
                      </>
                    )}
                  </Group>
                )}
                <div className="tl-row" style={{ gridTemplateColumns: columns }}>
                  <span className="tl-label tl-sticky" title={`${g.gpu}: ${status}`}>
                    GPU {g.index}
                    {g.unavailable?.reason === "unhealthy" ? " · unhealthy" : ""}
                  </span>
                  <div
                    className="tl-track"
                    onClick={props.onPick ? click : undefined}
                    onKeyDown={stop ? key : undefined}
                    tabIndex={stop ? 0 : undefined}
                    role={stop ? "slider" : "img"}
                    aria-valuemin={stop ? range.start : undefined}
                    aria-valuemax={stop ? range.end : undefined}
                    aria-valuenow={stop ? (props.pick?.start ?? now) : undefined}
                    aria-valuetext={stop ? (props.pickText ?? "no window picked") : undefined}
                    aria-label={stop ? "Start of your window" : `${g.server} GPU ${g.index}: ${status}`}
                    aria-describedby={stop ? "timeline-keys" : undefined}
                    data-testid={stop ? "timeline-pick" : undefined}
                  >
                    {g.unavailable && downFrom && (
                      <div
                        className="tl-seg down"
                        data-testid="unavailable"
                        style={{ left: `${downFrom.left}%`, width: `${downFrom.width}%` }}
                        title={unavailableText(g.unavailable)}
                      >
                        {REASON_TEXT[g.unavailable.reason] ?? g.unavailable.reason}
                      </div>
                    )}
                    {g.segments.map((s, i) => {
                      const p = placeSegment(range, Date.parse(s.starts_at), Date.parse(s.ends_at));
                      if (!p) return null;
                      const when = `${formatDateTime(s.starts_at, zone)} – ${formatDateTime(s.ends_at, zone)}`;
                      return (
                        <div
                          key={i}
                          className={`tl-seg ${s.mine ? "mine" : "busy"}${s.yielding ? " yielding" : ""}`}
                          data-testid={s.yielding ? "segment-yielding" : undefined}
                          style={{ left: `${p.left}%`, width: `${p.width}%` }}
                          title={segmentTitle(s, when)}
                        >
                          {s.mine ? s.project : ""}
                        </div>
                      );
                    })}
                    {drawPick && <div className="tl-seg pick" data-testid="pick" style={{ left: `${pick.left}%`, width: `${pick.width}%` }} />}
                    {nowAt && <div className="tl-now" style={{ left: `${nowAt.left}%` }} title="now" />}
                  </div>
                </div>
              </div>
            );
          })}
        </div>
      </div>
      <VisuallyHidden id="timeline-keys">
        Arrow keys move the start by an hour, with Shift by 15 minutes; Page Up and Page Down by a day; Home starts now.
      </VisuallyHidden>
      <VisuallyHidden aria-live="polite" data-testid="timeline-announce">
        {announce}
      </VisuallyHidden>
    </div>
  );
}

/** What each fill means; the swatches are the segments' own classes, so the legend cannot drift from them. */
function TimelineLegend() {
  const items = [
    { cls: "free", label: "free" },
    { cls: "busy", label: "booked by others" },
    { cls: "mine", label: "your projects'" },
    { cls: "busy yielding", label: "preemptible: yields to a booking after notice" },
    { cls: "down", label: "not bookable now" },
  ];
  return (
    <Group gap="md" mb={4} component="ul" className="tl-legend" aria-label="Timeline legend" data-testid="timeline-legend">
      {items.map((i) => (
        <Group key={i.cls} gap={4} component="li" wrap="nowrap">
          <span className={`tl-swatch tl-seg ${i.cls}`} aria-hidden />
          <Text size="xs">{i.label}</Text>
        </Group>
      ))}
    </Group>
  );
}
