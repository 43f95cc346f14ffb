import { Anchor, Button, Card, Group, Progress, SimpleGrid, Stack, Table, Text, Title } from "@mantine/core";
import { useMemo } from "react";
import { Link } from "react-router";

import { useBalances, useMe, useQuotas, useReservations } from "../api/hooks";
import type { Reservation } from "../api/types";
import { StateBadge } from "../components/Badges";
import { QueryState } from "../components/QueryState";
import { ACTIVE_STATES, formatCredits, formatDateTime, formatRelative } from "../lib/format";

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
        <Title order={2}>Dashboard</Title>
        <Button component={Link} to="/availability">
          Book GPUs
        </Button>
      </Group>

      <Title order={4}>My projects</Title>
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

      <Title order={4}>Running</Title>
      <QueryState isLoading={reservations.isLoading} error={reservations.error} isEmpty={running.length === 0}
        empty="Nothing is running." label="reservations">
        <ReservationTable rows={running} />
      </QueryState>

      <Title order={4}>Upcoming</Title>
      <QueryState isLoading={reservations.isLoading} error={reservations.error} isEmpty={upcoming.length === 0}
        empty={<>No upcoming reservations. <Anchor component={Link} to="/availability">Find a free window</Anchor>.</>}
        label="reservations">
        <ReservationTable rows={upcoming} />
      </QueryState>
    </Stack>
  );
}

export function ReservationTable({ rows }: { rows: Reservation[] }) {
  return (
    <Table.ScrollContainer minWidth={560}>
      <Table striped highlightOnHover>
        <Table.Thead>
          <Table.Tr>
            <Table.Th>Name</Table.Th>
            <Table.Th>Project</Table.Th>
            <Table.Th>State</Table.Th>
            <Table.Th>GPUs</Table.Th>
            <Table.Th>Starts</Table.Th>
            <Table.Th>Ends</Table.Th>
          </Table.Tr>
        </Table.Thead>
        <Table.Tbody>
          {rows.map((r) => (
            <Table.Tr key={r.id}>
              <Table.Td>
                <Anchor component={Link} to={`/reservations/${r.id}`}>
                  {r.name}
                </Anchor>
              </Table.Td>
              <Table.Td>{r.project}</Table.Td>
              <Table.Td>
                <StateBadge state={r.state} />
              </Table.Td>
              <Table.Td>
                {r.spec.whole_servers ? `${r.spec.whole_servers} server(s)` : `${r.spec.gpu_count ?? "?"}`}
                {r.spec.gpu_model ? ` × ${r.spec.gpu_model}` : ""}
              </Table.Td>
              <Table.Td title={formatDateTime(r.starts_at)}>{formatRelative(r.starts_at)}</Table.Td>
              <Table.Td title={formatDateTime(r.ends_at)}>{formatRelative(r.ends_at)}</Table.Td>
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}
