import { Alert, Anchor, Button, Group, Select, Stack, Table, Text, Title, VisuallyHidden } from "@mantine/core";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { Link } from "react-router";

import { api, isMissingEndpoint } from "../api/client";
import { useOperatorQueue, usePriorityClasses, useQueuedRequests } from "../api/hooks";
import type { QueueEntry } from "../api/types";
import { StateBadge } from "../components/Badges";
import { ClassBadge } from "../components/ClassBadge";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { useShownZone } from "../components/ZoneToggle";
import { formatDateTime, formatDuration, shortUuid } from "../lib/format";
import { classLabel, operatorActions, reasonText, toQueueEntry } from "../lib/queue";

const POLL_MS = 10_000;

/**
 * Operators: the whole queue across projects, in the pass's order, with each request's reason; hold, release
 * and a class change per row. Reads requests/queue/ (with position, fair share, blocked_by/blocked_until);
 * where the server does not serve it yet, every project's waiting requests from requests/, without those.
 */
export function OperatorQueuePage() {
  const zone = useShownZone();
  const queue = useOperatorQueue(POLL_MS);
  const classes = usePriorityClasses().data;
  const missing = isMissingEndpoint(queue.error);
  // A server without requests/queue/ has no held state either (its filter refuses "held"): queued ones only.
  const fallback = useQueuedRequests({ state: "queued" }, missing ? POLL_MS : undefined);
  const rows: QueueEntry[] | undefined = missing ? fallback.data?.map(toQueueEntry) : queue.data;
  const queryClient = useQueryClient();
  const act = useMutation({
    mutationFn: ({ id, action, body }: { id: string; action: string; body: Record<string, string> }) =>
      api.post(`requests/${id}/${action}/`, body),
    onSettled: () => Promise.all([
      queryClient.invalidateQueries({ queryKey: ["operator-queue"] }),
      queryClient.invalidateQueries({ queryKey: ["requests"] }),
    ]),
  });

  return (
    <Stack>
      <Title order={1} size="h2">
        Whole queue
      </Title>
      <Text size="sm" c="dimmed">
        Every project's waiting requests in the order the queue pass serves them (class, fair share, first come),
        then the held ones. The reason is the last pass's: what a request waits for and the reservation whose end
        frees its GPUs.
      </Text>
      {missing && (
        <Alert color="yellow" data-testid="queue-fallback">
          This server does not serve the operators' queue view yet: the waiting requests are shown without their
          order, fair share or blocking reservation, and hold, release and class changes may be refused.
        </Alert>
      )}
      {act.error && (
        <ErrorAlert
          error={act.error}
          title={isMissingEndpoint(act.error) ? "This server does not offer that action yet" : "The action was refused"}
        />
      )}
      <QueryState
        isLoading={missing ? fallback.isLoading : queue.isLoading}
        error={missing ? fallback.error : queue.error}
        isEmpty={rows?.length === 0}
        empty="Nothing is waiting."
        label="the queue"
      >
        <ResponsiveTable minWidth={1100} striped data-testid="operator-queue">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>#</Table.Th>
              <Table.Th>Request</Table.Th>
              <Table.Th>Class</Table.Th>
              <Table.Th style={{ minWidth: 110 }}>State</Table.Th>
              <Table.Th>Fair share</Table.Th>
              <Table.Th>Reason</Table.Th>
              <Table.Th>Blocked by</Table.Th>
              <Table.Th>
                <VisuallyHidden>Actions</VisuallyHidden>
              </Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {(rows ?? []).map((r) => {
              const can = operatorActions(r.state);
              const busy = act.isPending && act.variables?.id === r.id;
              return (
                <Table.Tr key={r.id} data-testid={`queue-entry-${r.name}`}>
                  <Table.Td data-label="#">{r.position ?? "–"}</Table.Td>
                  <Table.Td data-label="Request">
                    <Text size="sm" fw={500}>{r.name}</Text>
                    <Text size="xs" c="dimmed">
                      {r.project} · {r.spec} · {formatDuration(r.duration_seconds)} · queued {formatDateTime(r.created_at)}
                    </Text>
                  </Table.Td>
                  <Table.Td data-label="Class">
                    {can.changeClass ? (
                      <Select
                        size="xs"
                        w={140}
                        aria-label={`Class of ${r.name}`}
                        // Until the classes load, the row's own class alone, so the picker shows it.
                        data={(classes ?? [{ name: r.priority_class }]).map((c) => ({ value: c.name, label: classLabel(c.name) }))}
                        value={r.priority_class}
                        allowDeselect={false}
                        disabled={busy}
                        onChange={(v) => {
                          if (v && v !== r.priority_class) {
                            act.mutate({ id: r.id, action: "priority-class", body: { priority_class: v, reason: "changed in the portal" } });
                          }
                        }}
                      />
                    ) : (
                      <ClassBadge name={r.priority_class} />
                    )}
                  </Table.Td>
                  <Table.Td data-label="State">
                    <StateBadge state={r.state} />
                  </Table.Td>
                  <Table.Td data-label="Fair share">
                    {typeof r.fair_share_factor === "number" ? r.fair_share_factor.toFixed(3) : "–"}
                  </Table.Td>
                  <Table.Td data-label="Reason" data-testid="entry-reason">
                    <Text size="sm">{r.reason ? reasonText(r.reason, zone) : "–"}</Text>
                  </Table.Td>
                  <Table.Td data-label="Blocked by">
                    {r.blocked_by ? (
                      <>
                        <Anchor component={Link} to={`/reservations/${r.blocked_by}`}>
                          reservation {shortUuid(r.blocked_by)}
                        </Anchor>
                        {r.blocked_until && <Text size="xs">until {formatDateTime(r.blocked_until)}</Text>}
                      </>
                    ) : (
                      "–"
                    )}
                  </Table.Td>
                  <Table.Td>
                    <Group gap={4} wrap="nowrap">
                      {can.hold && (
                        <Button size="xs" variant="light" loading={busy} aria-label={`Hold ${r.name}`}
                          onClick={() => act.mutate({ id: r.id, action: "hold", body: { reason: "held in the portal" } })}>
                          Hold
                        </Button>
                      )}
                      {can.release && (
                        <Button size="xs" variant="light" loading={busy} aria-label={`Release ${r.name}`}
                          onClick={() => act.mutate({ id: r.id, action: "release", body: { reason: "released in the portal" } })}>
                          Release
                        </Button>
                      )}
                    </Group>
                  </Table.Td>
                </Table.Tr>
              );
            })}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
    </Stack>
  );
}
