import { Anchor, Badge, Button, Card, Group, SegmentedControl, Select, SimpleGrid, Stack, Table, Text, TextInput, Title } from "@mantine/core";
import { BarChart, LineChart } from "@mantine/charts";
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";

import { api, buildUrl, isMissingEndpoint } from "../api/client";
import { useMe } from "../api/hooks";
import type { Page } from "../api/types";
import { NotAvailable, QueryState } from "../components/QueryState";
import { formatCredits, formatDateTime, formatPercent } from "../lib/format";
import { reportRange, type UsageReport, type UsagePoint } from "../lib/report";

interface LedgerEntry {
  id: number;
  kind: string;
  amount: string;
  reservation: string | null;
  reason: string;
  actor_label: string;
  created_at: string;
}

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
  const me = useMe().data!;
  const [project, setProject] = useState<string | null>(me.memberships[0]?.project_slug ?? null);
  const [from, setFrom] = useState(monthStart());
  const [until, setUntil] = useState(tomorrow());
  const [groupBy, setGroupBy] = useState<GroupBy>("day");
  const range = reportRange(from, until);
  const query = { project: project ?? undefined, start: range.start, end: range.end, group_by: groupBy };

  const report = useQuery({
    queryKey: ["usage-report", query],
    enabled: !!project,
    queryFn: () => optional<UsageReport>("usage/report", query),
  });
  const series = useQuery({
    queryKey: ["usage-timeseries", project, range],
    enabled: !!project,
    queryFn: () => optional<UsagePoint[]>("usage/timeseries", { project: project ?? undefined, start: range.start, end: range.end, bucket: "day" }),
  });
  const entries = useQuery({
    queryKey: ["ledger-entries", project, range],
    enabled: !!project,
    queryFn: () =>
      api.get<Page<LedgerEntry>>("ledger/entries/", { project: project ?? undefined, created_after: range.start, created_before: range.end, limit: 200 }),
  });

  const rows = report.data?.rows ?? [];
  const totals = report.data?.totals;
  return (
    <Stack>
      <Title order={2}>Usage</Title>
      <Group align="flex-end">
        <Select label="Project" data={me.memberships.map((m) => ({ value: m.project_slug, label: m.project_name }))}
          value={project} onChange={setProject} allowDeselect={false} />
        <TextInput type="date" label="From (UTC)" value={from} onChange={(e) => setFrom(e.currentTarget.value)} />
        <TextInput type="date" label="Until (UTC)" value={until} onChange={(e) => setUntil(e.currentTarget.value)} />
        {report.data && (
          <Button component="a" variant="default" href={buildUrl("usage/report.csv", query)} download data-testid="csv-download">
            Download CSV
          </Button>
        )}
      </Group>

      {report.data === null ? (
        <NotAvailable what="The usage report (GPU-hours, utilization, cost, CSV)" />
      ) : (
        <QueryState isLoading={report.isLoading} error={report.error} label="the usage report">
          {totals && (
            <SimpleGrid cols={{ base: 2, sm: 3, lg: 6 }} data-testid="usage-totals">
              <Stat label="Booked GPU-h" value={totals.booked_gpu_hours.toFixed(2)} />
              <Stat label="Used GPU-h" value={totals.used_gpu_hours.toFixed(2)} />
              <Stat label="Idle GPU-h" value={totals.idle_gpu_hours.toFixed(2)} />
              <Stat label="Mean utilization" value={formatPercent(totals.util_mean_percent)} warn={totals.low_utilization} />
              <Stat label="Energy" value={`${totals.energy_kwh.toFixed(2)} kWh`} />
              <Stat label="Credits / cost" value={`${formatCredits(totals.credits)} / ${totals.cost == null ? "–" : `${formatCredits(totals.cost)} ${totals.currency}`}`} />
            </SimpleGrid>
          )}
          <Card withBorder>
            <Group justify="space-between" mb="xs">
              <Text fw={600}>GPU-hours</Text>
              <SegmentedControl size="xs" value={groupBy} onChange={(v) => setGroupBy(v as GroupBy)} aria-label="Group by"
                data={[{ value: "day", label: "Day" }, { value: "user", label: "User" }, { value: "gpu_model", label: "GPU model" }, { value: "reservation", label: "Reservation" }]} />
            </Group>
            {rows.length === 0 ? (
              <Text c="dimmed" size="sm" ta="center" p="md">No usage in this range.</Text>
            ) : (
              <>
                <BarChart h={240} data={rows} dataKey="label" withLegend
                  series={[{ name: "booked_gpu_hours", label: "booked", color: "gray.5" }, { name: "used_gpu_hours", label: "used", color: "blue.6" }, { name: "idle_gpu_hours", label: "idle", color: "orange.5" }]} />
                <Table.ScrollContainer minWidth={760} mt="md">
                  <Table striped data-testid="usage-rows">
                    <Table.Thead>
                      <Table.Tr>
                        <Table.Th>{groupBy.replace("_", " ")}</Table.Th><Table.Th>Booked GPU-h</Table.Th><Table.Th>Used GPU-h</Table.Th>
                        <Table.Th>Idle GPU-h</Table.Th><Table.Th>Utilization</Table.Th><Table.Th>Energy kWh</Table.Th><Table.Th>Credits</Table.Th><Table.Th>Cost</Table.Th>
                      </Table.Tr>
                    </Table.Thead>
                    <Table.Tbody>
                      {rows.map((r) => (
                        <Table.Tr key={r.key}>
                          <Table.Td>{groupBy === "reservation" ? <Anchor component={Link} to={`/reservations/${r.key}`}>{r.label}</Anchor> : r.label}</Table.Td>
                          <Table.Td>{r.booked_gpu_hours.toFixed(2)}</Table.Td>
                          <Table.Td>{r.used_gpu_hours.toFixed(2)}</Table.Td>
                          <Table.Td>{r.idle_gpu_hours.toFixed(2)}</Table.Td>
                          <Table.Td>{formatPercent(r.util_mean_percent)} {r.low_utilization && <Badge color="orange" size="xs">low</Badge>}</Table.Td>
                          <Table.Td>{r.energy_kwh.toFixed(2)}</Table.Td>
                          <Table.Td>{formatCredits(r.credits)}</Table.Td>
                          <Table.Td>{r.cost == null ? "–" : `${formatCredits(r.cost)} ${r.currency}`}</Table.Td>
                        </Table.Tr>
                      ))}
                    </Table.Tbody>
                  </Table>
                </Table.ScrollContainer>
              </>
            )}
          </Card>
        </QueryState>
      )}

      <Card withBorder>
        <Text fw={600} mb="xs">Utilization by day</Text>
        {series.data === null ? (
          <NotAvailable what="The usage time series" />
        ) : (
          <QueryState isLoading={series.isLoading} error={series.error} isEmpty={(series.data ?? []).length === 0}
            empty="No usage in this range." label="the time series">
            <LineChart h={200} data={(series.data ?? []).map((p) => ({ ...p, util_mean_percent: p.util_mean_percent ?? 0 }))} dataKey="at" unit="%"
              series={[{ name: "util_mean_percent", label: "mean utilization", color: "blue.6" }]} />
          </QueryState>
        )}
      </Card>

      <Card withBorder>
        <Text fw={600} mb="xs">Ledger entries</Text>
        <QueryState isLoading={entries.isLoading} error={entries.error} isEmpty={entries.data?.results.length === 0}
          empty="No ledger entries in this range." label="ledger entries">
          <Table.ScrollContainer minWidth={600}>
            <Table striped>
              <Table.Thead>
                <Table.Tr>
                  <Table.Th>When</Table.Th><Table.Th>Kind</Table.Th><Table.Th>Credits</Table.Th>
                  <Table.Th>Reservation</Table.Th><Table.Th>By</Table.Th><Table.Th>Reason</Table.Th>
                </Table.Tr>
              </Table.Thead>
              <Table.Tbody>
                {entries.data?.results.map((e) => (
                  <Table.Tr key={e.id}>
                    <Table.Td>{formatDateTime(e.created_at)}</Table.Td>
                    <Table.Td>{e.kind}</Table.Td>
                    <Table.Td>{formatCredits(e.amount)}</Table.Td>
                    <Table.Td>{e.reservation ? <Anchor component={Link} to={`/reservations/${e.reservation}`}>{e.reservation.slice(0, 8)}</Anchor> : "–"}</Table.Td>
                    <Table.Td>{e.actor_label}</Table.Td>
                    <Table.Td>{e.reason}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        </QueryState>
      </Card>
    </Stack>
  );
}

function Stat({ label, value, warn }: { label: string; value: string; warn?: boolean }) {
  return (
    <Card withBorder p="sm">
      <Text size="xs" c="dimmed">{label}</Text>
      <Text size="lg" fw={700} c={warn ? "orange" : undefined}>{value}</Text>
      {warn && <Text size="xs" c="orange">under 70%</Text>}
    </Card>
  );
}
