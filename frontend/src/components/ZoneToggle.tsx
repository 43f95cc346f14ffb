import { Button, SegmentedControl, Text, Tooltip } from "@mantine/core";
import { useSyncExternalStore } from "react";

import { setZoneMode, shownZone, subscribeZone, viewerZone, zoneLabel, zoneMode, type ZoneMode } from "../lib/format";

/** The zone every time is shown in; a component using it re-renders when the header's toggle changes it. */
export function useShownZone(): string {
  return useSyncExternalStore(subscribeZone, shownZone);
}

/** Names the zone times are shown in and switches between the viewer's zone and UTC (remembered). */
export function ZoneToggle() {
  const zone = useShownZone();
  const viewer = viewerZone();
  const city = viewer.split("/").pop()!.replace(/_/g, " ");
  const label = zoneLabel(zone);
  if (viewer === "UTC") {
    return (
      <Text size="xs" data-testid="zone-shown" title="Times are shown in UTC, the browser's zone">
        UTC
      </Text>
    );
  }
  const other: ZoneMode = zoneMode() === "utc" ? "viewer" : "utc";
  return (
    <>
      <Tooltip label={`Times are shown in ${label}`} withArrow>
        <SegmentedControl
          visibleFrom="sm"
          size="xs"
          aria-label={`Time zone shown: ${label}`}
          data-testid="zone-toggle"
          data-zone={zone}
          value={zoneMode()}
          onChange={(v) => setZoneMode(v as ZoneMode)}
          data={[
            { value: "viewer", label: city },
            { value: "utc", label: "UTC" },
          ]}
        />
      </Tooltip>
      {/* Phones: one short button that names the zone shown and switches to the other. */}
      <Button
        hiddenFrom="sm"
        variant="default"
        size="compact-xs"
        data-testid="zone-toggle-compact"
        aria-label={`${shortName(zone)}: times are shown in ${label}; show ${other === "utc" ? "UTC" : viewer}`}
        onClick={() => setZoneMode(other)}
      >
        {shortName(zone)}
      </Button>
    </>
  );
}

/** "GMT+1", "PST", "UTC": the zone's short name in English. */
function shortName(zone: string): string {
  if (zone === "UTC") return "UTC";
  const part = new Intl.DateTimeFormat("en-US", { timeZone: zone, timeZoneName: "short" })
    .formatToParts(new Date())
    .find((p) => p.type === "timeZoneName");
  return part?.value ?? zone;
}
