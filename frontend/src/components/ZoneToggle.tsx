import { SegmentedControl, Text, Tooltip } from "@mantine/core";
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
  return (
    <Tooltip label={`Times are shown in ${label}`} withArrow>
      <SegmentedControl
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
  );
}
