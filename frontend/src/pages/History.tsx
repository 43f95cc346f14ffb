import { Anchor, Group, MultiSelect, Select, Stack, Table, Text, TextInput, Title } from "@mantine/core";
import { useMemo, useState } from "react";
import { Link } from "react-router";

import { useMe, useReservations } from "../api/hooks";
import type { Reservation } from "../api/types";
import { StateBadge } from "../components/Badges";
import { QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatCredits, formatDateTime, formatDuration, fromLocalInput, toLocalInput } from "../lib/format";
import { endedAt, FINAL_STATES } from "../lib/reservation";
import { useNow } from "../lib/useNow";
import { gpusOf, WhenCell } from "./Dashboard";

const PERIODS = [
  { value: "1", label: "Last 24 hours" },
  { value: "7", label: "Last 7 days" },
  { value: "30", label: "Last 30 days" },
  { value: "all", label: "Any time" },
  { value: "custom", label: "Between two dates…" },
];
const DAY = 86_400_000;

/** The reservations that are over: filtered by state, project and the period they ended in. */
export function HistoryPage() {
  const me = useMe().data!;
  const [states, setStates] = useState<string[]>([]);
  const [project, setProject] = useState<string | null>(null);
  const [period, setPeriod] = useState<string>("30");
  const [from, setFrom] = useState(() => toLocalInput(new Date(Date.now() - 7 * DAY)));
  const [to, setTo] = useState(() => toLocalInput(new Date()));
  // The period's bounds are fixed when it is chosen, so the query (and its cache key) stays put between renders.
  const range = useMemo(() => {
    if (period === "all") return {};
    if (period === "custom") {
      return { ends_after: fromLocalInput(from)?.toISOString(), ends_before: fromLocalInput(to)?.toISOString() };
    }
    return { ends_after: new Date(Date.now() - Number(period) * DAY).toISOString() };
  }, [period, from, to]);
  const reservations = useReservations(
    { state: states.length ? states : FINAL_STATES, project: project ?? undefined, ...range },
    30_000,
  );
  const rows = reservations.data?.results ?? [];

  return (
    <Stack>
      <Title order={1}>History</Title>
      <Text size="sm" c="dimmed">
        Reservations that are over, newest first: completed, cancelled, failed or interrupted. The credits are
        what the ledger charged.
      </Text>
      <Group align="flex-end" component="form" aria-label="Filter the history" onSubmit={(e) => e.preventDefault()}>
        <MultiSelect label="State" placeholder={states.length ? undefined : "Every final state"} data={FINAL_STATES}
          value={states} onChange={setStates} clearable w={280} data-testid="history-state" />
        <Select label="Project" placeholder="All projects" clearable value={project} onChange={setProject} w={220}
          data={me.memberships.map((m) => ({ value: m.project_slug, label: m.project_name }))} data-testid="history-project" />
        <Select label="Ended" value={period} onChange={(v) => setPeriod(v ?? "30")} allowDeselect={false} w={200}
          data={PERIODS} data-testid="history-period" />
        {period === "custom" && (
          <>
            <TextInput type="datetime-local" label="From" value={from} onChange={(e) => setFrom(e.currentTarget.value)} />
            <TextInput type="datetime-local" label="To" value={to} onChange={(e) => setTo(e.currentTarget.value)} />
          </>
        )}
      </Group>
      <QueryState isLoading={reservations.isLoading} error={reservations.error} isEmpty={rows.length === 0}
        empty="No finished reservations match." label="the history">
        <HistoryTable rows={rows} />
        {reservations.data && reservations.data.count > rows.length && (
          <Text size="xs" c="dimmed">
            The newest {rows.length} of {reservations.data.count}; narrow the filters to see older ones.
          </Text>
        )}
      </QueryState>
    </Stack>
  );
}

function HistoryTable({ rows }: { rows: Reservation[] }) {
  const now = useNow();
  return (
    <ResponsiveTable minWidth={900} striped highlightOnHover aria-label="Finished reservations" data-testid="history-table">
      <Table.Thead>
        <Table.Tr>
          <Table.Th>Name</Table.Th>
          <Table.Th>Project</Table.Th>
          <Table.Th>State</Table.Th>
          <Table.Th>GPUs</Table.Th>
          <Table.Th>Started</Table.Th>
          <Table.Th>Ended</Table.Th>
          <Table.Th>Held for</Table.Th>
          <Table.Th>GPU-h</Table.Th>
          <Table.Th>Credits</Table.Th>
        </Table.Tr>
      </Table.Thead>
      <Table.Tbody>
        {rows.map((r) => (
          <Table.Tr key={r.id} data-testid={`history-row-${r.id}`}>
            <Table.Td data-label="Name">
              <Anchor component={Link} to={`/reservations/${r.id}`}>{r.name}</Anchor>
            </Table.Td>
            <Table.Td data-label="Project">{r.project}</Table.Td>
            <Table.Td data-label="State"><StateBadge state={r.state} /></Table.Td>
            <Table.Td data-label="GPUs">{gpusOf(r)}</Table.Td>
            {r.cost.elapsed_seconds === 0 && Date.parse(endedAt(r)) <= Date.parse(r.starts_at) ? (
              <Table.Td data-label="Started">never</Table.Td>
            ) : (
              <WhenCell iso={r.starts_at} now={now} label="Started" />
            )}
            <WhenCell iso={endedAt(r)} now={now} label="Ended" />
            <Table.Td data-label="Held for" title={formatDateTime(r.ends_at)}>{formatDuration(r.cost.elapsed_seconds)}</Table.Td>
            <Table.Td data-label="GPU-h">{formatCredits(r.cost.gpu_hours)}</Table.Td>
            <Table.Td data-label="Credits">{formatCredits(r.cost.credits_charged ?? r.cost.credits_so_far)}</Table.Td>
          </Table.Tr>
        ))}
      </Table.Tbody>
    </ResponsiveTable>
  );
}
