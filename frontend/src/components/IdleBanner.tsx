import { Alert, Button, Group, Text } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";

import { api } from "../api/client";
import type { IdleReclamation, ReservationDetail } from "../api/types";
import { formatDateTime, formatPercent } from "../lib/format";
import { idleWarningOpen } from "../lib/idle";
import { useNow } from "../lib/useNow";
import { ErrorAlert } from "./QueryState";

/** During an idle warning's grace: what was found, when the GPUs go, and "Keep it" (docs/efficiency.md). */
export function IdleBanner({ r }: { r: ReservationDetail }) {
  const queryClient = useQueryClient();
  const now = useNow(10_000);
  const live = ["starting", "running"].includes(r.state);
  const idle = useQuery({
    queryKey: ["reservation-idle", r.id, r.ends_at],
    queryFn: () => api.get<{ idle: IdleReclamation | null }>(`reservations/${r.id}/idle/`),
    enabled: live,
  });
  const keep = useMutation({
    mutationFn: () => api.post<ReservationDetail>(`reservations/${r.id}/keep/`, {}),
    onSuccess: (data) => {
      queryClient.setQueryData(["reservation", r.id], data);
      queryClient.invalidateQueries({ queryKey: ["reservation-idle", r.id] });
      queryClient.invalidateQueries({ queryKey: ["reservations"] });
    },
  });
  const found = idle.data?.idle;
  if (!live || !found || !idleWarningOpen(found, now)) return null;
  return (
    <Alert color="orange" title="This reservation looks idle" data-testid="idle-banner" role="region" aria-label="Idle warning">
      <Text size="sm">
        Every GPU stayed under {formatPercent(Number(found.threshold_percent))} utilization for {found.idle_minutes} minutes
        (at most {formatPercent(found.util_percent, 1)}). Its GPUs will be released at {formatDateTime(found.cut_ends_at)} and
        the unused credits returned, unless you keep it; kept, it runs to {formatDateTime(found.booked_ends_at)}.
      </Text>
      <Group mt="xs">
        <Button color="orange" onClick={() => keep.mutate()} loading={keep.isPending} data-testid="idle-keep">
          Keep it
        </Button>
      </Group>
      {keep.error && <ErrorAlert error={keep.error} title="Could not keep it" />}
    </Alert>
  );
}
