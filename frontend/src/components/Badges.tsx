import { Badge, Tooltip } from "@mantine/core";

import { STATE_COLOR } from "../lib/format";

export function StateBadge({ state }: { state: string }) {
  return (
    <Badge color={STATE_COLOR[state] ?? "gray"} variant="light" data-testid="state-badge">
      {state}
    </Badge>
  );
}

export function SimulatedBadge() {
  return (
    <Tooltip label="Reported by a simulated agent: not real hardware">
      <Badge color="grape" variant="outline" size="sm">
        simulated
      </Badge>
    </Tooltip>
  );
}
