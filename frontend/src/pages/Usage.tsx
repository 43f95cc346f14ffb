import { Alert, Anchor, Badge, Button, Card, Group, List, SegmentedControl, SimpleGrid, Stack, Table, Text, TextInput, Title } from "@mantine/core";
import { BarChart } from "@mantine/charts";
import { useQuery } from "@tanstack/react-query";
import { useEffect, useState } from "react";
import { Link } from "react-router";

import { api, buildUrl, isMissingEndpoint } from "../api/client";
import type { Page } from "../api/types";
import { LedgerTable, ProvisionalBadge } from "../components/Ledger";
import { ProjectPicker, useProjectChoices } from "../components/ProjectPicker";
import { NotAvailable, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatCredits, formatDateTime, formatPercent } from "../lib/format";
import { explainMoney, moneyByReservation, reportRange, shownZone, type LedgerLine, type UsagePoint, type UsageReport } from "../lib/report";

type GroupBy = "day" | "user" | "gpu_model" | "reservation";

function monthStart(): string {
  const d = new Date();
  return new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1)).toISOString().slice(0, 10);
}

function tomorrow(): string {
  return new Date(Date.now() + 86_400_000).toISOString().slice(0, 10);
}

/** Endpoints still being built answer 404: null means "not available yet", never an empty report. */
async function optional<T>(path: string, query: Record<string, string | undefined>): Promise<T | null> {
  try {
    return await api.get<T>(path, query);
  } catch (e) {
    if (isMissingEndpoint(e)) return null;
    throw e;
  }
}

export function UsagePage() {
  const { choices } = useProjectChoices();
  const [project, setProject] = useState<string | null>(null);
  useEffect(() => {
    if (!project && choices.length) setProject(choices[0].value);
  }, [project, choices]);
  const [from, setFrom] = useState(monthStart());
  const [until, setUntil] = useState(tomorrow());
  const [groupBy, setGroupBy] = useState<GroupBy>("day");
  const zone = shownZone();
  const range = reportRange(from, until);
  const query = { project: project ?? undefined, start: range.start, end: range.end, group_by: groupBy };

  const report = useQuery({
    queryKey: ["usage-report", query],
    enabled: !!project,
    refetchInterval: 30_000,
    queryFn: () => optional<UsageReport>("usage/report", query),
  });
  const byReservation = useQuery({
    queryKey: ["usage-report", { ...query, group_by: "reservation" }],
    enabled: !!project,
    refetchInterval: 30_000,
    queryFn: () => optional<UsageReport>("usage/report", { ...query, group_by: "reservation" }),
  });
  const series = useQuery({
    queryKey: ["usage-timeseries", project, range],
    enabled: !!project,
    refetchInterval: 30_000,
    queryFn: () => optional<UsagePoint[]>("usage/timeseries", { project: project ?? undefined, start: range.start, end: range.end, bucket: "hour" }),
  });
  const entries = useQuery({
    queryKey: ["ledger-entries", project, range],
    enabled: !!project,
    queryFn: () =>
      api.get<Page<LedgerLine>>("ledger/entries/", { project: project ?? undefined, created_after: range.start, created_before: range.end, limit: 200 }),
  });

  const rows = report.data?.rows ?? [];
  const keyHeader = groupBy === "day" ? "Day (UTC)" : groupBy.replace("_", " ");
  const totals = report.data?.totals;
  const hourly = (series.data ?? []).map((p) => ({
    hour: formatDateTime(p.at),
    final: p.provisional ? 0 : p.used_gpu_hours,
    provisional: p.provisional ? p.used_gpu_hours : 0,
    idle: p.idle_gpu_hours,
    util: p.util_mean_percent,
  }));
  const perReservation = (byReservation.data?.rows ?? []).map((r) => ({
    reservation: `${r.label} ${r.key.slice(0, 8)}`,
    booked: r.booked_gpu_hours,
    final: r.provisional ? 0 : r.used_gpu_hours,
    provisional: r.provisional ? r.used_gpu_hours : 0,
  }));
  const money = moneyByReservation(entries.data?.results ?? []);
  return (
    <Stack>
      <Title order={1}>Usage</Title>
      <Text size="sm" c="dimmed" data-testid="zone-note">
        Usage is counted in UTC hours, so the report's days run from 00:00 to 24:00 UTC. Times shown are in {zone}.
      </Text>
      <Group align="flex-end">
        <ProjectPicker value={project} onChange={setProject} choices={choices} />
        <TextInput type="date" label="From (UTC day)" value={from} onChange={(e) => setFrom(e.currentTarget.value)} />
        <TextInput type="date" label="Until (UTC day, not included)" value={until} onChange={(e) => setUntil(e.currentTarget.value)} />
        {report.data && (
          <Button component="a" variant="default" href={buildUrl("usage/report.csv", query)} download data-testid="csv-download">
            Download CSV
          </Button>
        )}
      </Group>

      {report.data === null ? (
        <NotAvailable what="The usage report (GPU-hours, utilization, cost, CSV)" />
      ) : (
        <QueryState isLoading={!!project && report.isLoading} error={report.error} label="the usage report">
          {report.data?.provisional && (
            <Alert color="yellow" title="Some figures are provisional" data-testid="provisional-note" styles={{ title: { color: "var(--mantine-color-dark-9)" } }}>
              Figures marked <b>provisional</b> are still settling: a reservation that is running (or just ended and not yet
              settled) shows what it has booked and run so far, with credits estimated at its GPUs' rates until the ledger
              charges it; and utilization, idle time and energy of the last hour or so are recomputed as telemetry
              arrives{report.data.final_until ? ` (final up to ${formatDateTime(report.data.final_until)} ${zone})` : ""}.
            </Alert>
          )}
          {totals && (
            <SimpleGrid cols={{ base: 2, sm: 3, lg: 6 }} data-testid="usage-totals">
              <Stat label="Booked GPU-h" value={totals.booked_gpu_hours.toFixed(2)} provisional={totals.provisional} />
              <Stat label="Used GPU-h" value={totals.used_gpu_hours.toFixed(2)} provisional={totals.provisional} />
              <Stat label="Idle GPU-h" value={totals.idle_gpu_hours.toFixed(2)} provisional={totals.provisional} />
              <Stat label="Mean utilization" value={formatPercent(totals.util_mean_percent)} warn={totals.low_utilization} provisional={totals.provisional} />
              <Stat label="Energy" value={`${totals.energy_kwh.toFixed(2)} kWh`} provisional={totals.provisional} />
              <Stat label="Credits / cost" value={`${formatCredits(totals.credits)} / ${totals.cost == null ? "–" : `${formatCredits(totals.cost)} ${totals.currency}`}`} provisional={totals.provisional} />
            </SimpleGrid>
          )}
          <Card withBorder>
            <Group justify="space-between" mb="xs">
              <Title order={2} size="h4">GPU-hours</Title>
              <SegmentedControl size="xs" value={groupBy} onChange={(v) => setGroupBy(v as GroupBy)} aria-label="Group by"
                data={[{ value: "day", label: "Day (UTC)" }, { value: "user", label: "User" }, { value: "gpu_model", label: "GPU model" }, { value: "reservation", label: "Reservation" }]} />
            </Group>
            {rows.length === 0 ? (
              <Text c="dimmed" size="sm" ta="center" p="md">No usage in this range.</Text>
            ) : (
              <ResponsiveTable minWidth={760} striped aria-label="GPU-hours" data-testid="usage-rows">
                <Table.Thead>
                  <Table.Tr>
                    <Table.Th>{keyHeader}</Table.Th><Table.Th>Booked GPU-h</Table.Th><Table.Th>Used GPU-h</Table.Th>
                    <Table.Th>Idle GPU-h</Table.Th><Table.Th>Utilization</Table.Th><Table.Th>Energy kWh</Table.Th><Table.Th>Credits</Table.Th><Table.Th>Cost</Table.Th>
                  </Table.Tr>
                </Table.Thead>
                <Table.Tbody>
                  {rows.map((r) => (
                    <Table.Tr key={r.key} data-testid={`usage-row-${r.key}`}>
                      <Table.Td data-label={keyHeader}>
                        <Group gap={4} wrap="nowrap">
                          {groupBy === "reservation" ? <Anchor component={Link} to={`/reservations/${r.key}`}>{r.label}</Anchor> : r.label}
                          {r.provisional && <ProvisionalBadge />}
                        </Group>
                      </Table.Td>
                      <Table.Td data-label="Booked GPU-h">{r.booked_gpu_hours.toFixed(2)}</Table.Td>
                      <Table.Td data-label="Used GPU-h">{r.used_gpu_hours.toFixed(2)}</Table.Td>
                      <Table.Td data-label="Idle GPU-h">{r.idle_gpu_hours.toFixed(2)}</Table.Td>
                      <Table.Td data-label="Utilization">{formatPercent(r.util_mean_percent)} {r.low_utilization && <Badge color="red.9" variant="outline" size="xs">low</Badge>}</Table.Td>
                      <Table.Td data-label="Energy kWh">{r.energy_kwh.toFixed(2)}</Table.Td>
                      <Table.Td data-label="Credits">{formatCredits(r.credits)}</Table.Td>
                      <Table.Td data-label="Cost">{r.cost == null ? "–" : `${formatCredits(r.cost)} ${r.currency}`}</Table.Td>
                    </Table.Tr>
                  ))}
                </Table.Tbody>
              </ResponsiveTable>
            )}
          </Card>
        </QueryState>
      )}

      <SimpleGrid cols={{ base: 1, lg: 2 }}>
        <Card withBorder>
          <Title order={2} size="h4">Used GPU-hours by reservation</Title>
          <Text size="xs" c="dimmed" mb="xs">Provisional: still running or not settled yet.</Text>
          <QueryState isLoading={!!project && byReservation.isLoading} error={byReservation.error} isEmpty={perReservation.length === 0}
            empty="No reservation used GPUs in this range." label="usage by reservation">
            <div data-testid="chart-reservations" data-points={perReservation.length}>
              <BarChart h={240} data={perReservation} dataKey="reservation" type="stacked" withLegend unit=" GPU-h"
                series={[{ name: "final", label: "used", color: "blue.8" }, { name: "provisional", label: "used (provisional)", color: "yellow.6" }]} />
            </div>
          </QueryState>
        </Card>
        <Card withBorder>
          <Title order={2} size="h4">GPU-hours by hour ({zone})</Title>
          <Text size="xs" c="dimmed" mb="xs">Each bar is one hour of use; hours not final yet are provisional.</Text>
          {series.data === null ? (
            <NotAvailable what="The usage time series" />
          ) : (
            <QueryState isLoading={!!project && series.isLoading} error={series.error} isEmpty={hourly.length === 0}
              empty="No usage in this range." label="the time series">
              <div data-testid="chart-hourly" data-points={hourly.length}>
                <BarChart h={240} data={hourly} dataKey="hour" type="stacked" withLegend unit=" GPU-h"
                  series={[{ name: "final", label: "used", color: "blue.8" }, { name: "provisional", label: "used (provisional)", color: "yellow.6" }, { name: "idle", label: "idle", color: "gray.6" }]} />
              </div>
            </QueryState>
          )}
        </Card>
      </SimpleGrid>

      <Card withBorder>
        <Title order={2} size="h4" mb="xs">Ledger entries</Title>
        <Stack gap={4} mb="sm" data-testid="ledger-explained">
          <Text size="sm">
            How a reservation is paid for: booking it <b>holds</b> credits for its whole window, so they cannot be spent
            twice. When it ends the hold is <b>released</b> in full, and a <b>charge</b> is taken for the time its container
            actually ran. So the ledger shows three entries per reservation, and only the charge is a cost.
          </Text>
          {money.length > 0 && (
            <List size="sm" spacing={2}>
              {money.map((m) => (
                <List.Item key={m.reservation}>
                  <Anchor component={Link} to={`/reservations/${m.reservation}`}>{m.reservation.slice(0, 8)}</Anchor>: {explainMoney(m)}
                </List.Item>
              ))}
            </List>
          )}
        </Stack>
        <QueryState isLoading={!!project && entries.isLoading} error={entries.error} isEmpty={entries.data?.results.length === 0}
          empty="No ledger entries in this range." label="ledger entries">
          <LedgerTable entries={entries.data?.results ?? []} />
        </QueryState>
      </Card>
    </Stack>
  );
}

function Stat({ label, value, warn, provisional }: { label: string; value: string; warn?: boolean; provisional?: boolean }) {
  return (
    <Card withBorder p="sm">
      <Group gap={4} justify="space-between" wrap="nowrap">
        <Text size="xs" c="dimmed">{label}</Text>
        {provisional && <ProvisionalBadge />}
      </Group>
      <Text size="lg" fw={700} c={warn ? "red.9" : undefined}>{value}</Text>
      {warn && <Text size="xs" c="red.9">under 70%</Text>}
    </Card>
  );
}
