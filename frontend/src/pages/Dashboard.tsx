import { Anchor, Button, Card, Group, Progress, SimpleGrid, Stack, Table, Text, Title } from "@mantine/core";
import { useMemo } from "react";
import { Link } from "react-router";

import { useBalances, useMe, useQuotas, useReservations } from "../api/hooks";
import type { Reservation } from "../api/types";
import { StateBadge } from "../components/Badges";
import { QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { ACTIVE_STATES, formatCredits, formatDateTime, formatRelative } from "../lib/format";
import { useNow } from "../lib/useNow";

export function DashboardPage() {
  const me = useMe().data!;
  const balances = useBalances();
  const quotas = useQuotas();
  // Everything not yet over; refreshed so a reservation is seen to start.
  const nowIso = useMemo(() => new Date().toISOString(), []);
  const reservations = useReservations({ ends_after: nowIso }, 10_000);
  const active = (reservations.data?.results ?? []).filter((r) => ACTIVE_STATES.has(r.state));
  const running = active.filter((r) => ["starting", "running", "ending"].includes(r.state));
  const upcoming = active.filter((r) => !["starting", "running", "ending"].includes(r.state));

  return (
    <Stack>
      <Group justify="space-between">
        <Title order={1}>Dashboard</Title>
        <Button component={Link} to="/availability">
          Book GPUs
        </Button>
      </Group>

      <Title order={2} size="h4">My projects</Title>
      <QueryState
        isLoading={balances.isLoading || quotas.isLoading}
        error={balances.error || quotas.error}
        isEmpty={me.memberships.length === 0}
        empty="You are not a member of any project yet. Ask a project owner to add you."
        label="projects"
      >
        <SimpleGrid cols={{ base: 1, sm: 2, lg: 3 }}>
          {me.memberships.map((m) => {
            const bal = balances.data?.find((b) => b.project === m.project_slug);
            const quota = quotas.data?.find((q) => q.project === m.project_slug);
            const budget = quota ? Number(quota.credits_per_period) : 0;
            const left = bal ? Number(bal.balance) : 0;
            const usedPct = budget > 0 ? Math.min(100, Math.max(0, ((budget - left) / budget) * 100)) : 0;
            return (
              <Card withBorder key={m.project_id} data-testid={`project-${m.project_slug}`}>
                <Group justify="space-between">
                  <Text fw={600}>{m.project_name}</Text>
                  <Text size="xs" c="dimmed">
                    {m.project_slug} · {m.role}
                  </Text>
                </Group>
                <Text size="xl" fw={700} mt="xs">
                  {formatCredits(bal?.balance)} credits
                </Text>
                <Text size="xs" c="dimmed">
                  available now · {formatCredits(bal?.held)} held by bookings
                </Text>
                {quota ? (
                  <>
                    <Progress value={usedPct} mt="sm" aria-label="Share of this period's credits used" />
                    <Text size="xs" c="dimmed" mt={4}>
                      {formatCredits(budget - left)} of {formatCredits(budget)} credits this {quota.period} used or held
                      {quota.max_concurrent_gpus != null && ` · at most ${quota.max_concurrent_gpus} GPUs at once`}
                      {quota.max_reservation_hours != null && ` · at most ${formatCredits(quota.max_reservation_hours)} h per booking`}
                    </Text>
                  </>
                ) : (
                  <Text size="xs" c="dimmed" mt="sm">
                    No quota policy set.
                  </Text>
                )}
              </Card>
            );
          })}
        </SimpleGrid>
      </QueryState>

      <Title order={2} size="h4">Running</Title>
      <QueryState isLoading={reservations.isLoading} error={reservations.error} isEmpty={running.length === 0}
        empty="Nothing is running." label="reservations">
        <ReservationTable rows={running} withCost label="Running reservations" />
      </QueryState>

      <Title order={2} size="h4">Upcoming</Title>
      <QueryState isLoading={reservations.isLoading} error={reservations.error} isEmpty={upcoming.length === 0}
        empty={<>No upcoming reservations. <Anchor component={Link} to="/availability" underline="always">Find a free window</Anchor>.</>}
        label="reservations">
        <ReservationTable rows={upcoming} label="Upcoming reservations" />
      </QueryState>
      <Text size="sm">
        Finished reservations, their duration and what they cost are in the{" "}
        <Anchor component={Link} to="/history" underline="always">history</Anchor>.
      </Text>
    </Stack>
  );
}

/** When a reservation starts or ends: relative to now (refreshed), with the time itself under it. */
export function WhenCell({ iso, now, label }: { iso: string; now: number; label: string }) {
  return (
    <Table.Td data-label={label} title={formatDateTime(iso)}>
      <Stack gap={0}>
        <Text size="sm" span>{formatRelative(iso, now)}</Text>
        <Text size="xs" c="dimmed" span>{formatDateTime(iso)}</Text>
      </Stack>
    </Table.Td>
  );
}

export function gpusOf(r: Reservation): string {
  const what = r.spec.whole_servers ? `${r.spec.whole_servers} server(s)` : `${r.spec.gpu_count ?? "?"}`;
  return what + (r.spec.gpu_model ? ` × ${r.spec.gpu_model}` : "");
}

/** Reservations not yet over; `withCost` adds their rate and what they have cost so far. */
export function ReservationTable({ rows, withCost = false, label }: { rows: Reservation[]; withCost?: boolean; label: string }) {
  const now = useNow();
  return (
    <ResponsiveTable minWidth={withCost ? 760 : 560} striped highlightOnHover aria-label={label}>
      <Table.Thead>
        <Table.Tr>
          <Table.Th>Name</Table.Th>
          <Table.Th>Project</Table.Th>
          <Table.Th>State</Table.Th>
          <Table.Th>GPUs</Table.Th>
          <Table.Th>Starts</Table.Th>
          <Table.Th>Ends</Table.Th>
          {withCost && <Table.Th>Credits/h</Table.Th>}
          {withCost && <Table.Th>Cost so far</Table.Th>}
        </Table.Tr>
      </Table.Thead>
      <Table.Tbody>
        {rows.map((r) => (
          <Table.Tr key={r.id} data-testid={`reservation-row-${r.id}`}>
            <Table.Td data-label="Name">
              <Anchor component={Link} to={`/reservations/${r.id}`}>
                {r.name}
              </Anchor>
            </Table.Td>
            <Table.Td data-label="Project">{r.project}</Table.Td>
            <Table.Td data-label="State">
              <StateBadge state={r.state} />
            </Table.Td>
            <Table.Td data-label="GPUs">{gpusOf(r)}</Table.Td>
            <WhenCell iso={r.starts_at} now={now} label="Starts" />
            <WhenCell iso={r.ends_at} now={now} label="Ends" />
            {withCost && <Table.Td data-label="Credits/h" data-testid="row-rate">{formatCredits(r.cost?.credits_per_hour)}</Table.Td>}
            {withCost && (
              <Table.Td data-label="Cost so far" data-testid="row-cost">
                {formatCredits(r.cost?.credits_so_far)} credits
              </Table.Td>
            )}
          </Table.Tr>
        ))}
      </Table.Tbody>
    </ResponsiveTable>
  );
}
