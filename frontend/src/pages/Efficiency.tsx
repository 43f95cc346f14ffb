import { Alert, Anchor, Button, Card, Group, SimpleGrid, Stack, Table, Text, TextInput, Title } from "@mantine/core";
import { useQuery } from "@tanstack/react-query";
import { useEffect, useState } from "react";
import { Link } from "react-router";

import { api, buildUrl } from "../api/client";
import { useMe } from "../api/hooks";
import { ProjectPicker, useProjectChoices } from "../components/ProjectPicker";
import { QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatCredits, formatPercent } from "../lib/format";
import {
  compare,
  currentMonth,
  formatProfiling,
  formatShare,
  type EfficiencyFigures,
  type EfficiencyRanking,
  type EfficiencyStatement,
} from "../lib/efficiency";

/** A project's monthly efficiency statement beside its previous month and the fleet; operators also see every
 * project ranked by waste (docs/efficiency.md). */
export function EfficiencyPage() {
  const me = useMe();
  const operator = !!me.data?.is_operator;
  const { choices } = useProjectChoices();
  const [project, setProject] = useState<string | null>(null);
  useEffect(() => {
    if (!project && choices.length) setProject(choices[0].value);
  }, [project, choices]);
  const [month, setMonth] = useState(currentMonth());
  const query = { project: project ?? undefined, month };

  const statement = useQuery({
    queryKey: ["efficiency", query],
    enabled: !!project && /^\d{4}-\d{2}$/.test(month),
    queryFn: () => api.get<EfficiencyStatement>("usage/efficiency", query),
  });
  const ranking = useQuery({
    queryKey: ["efficiency-ranking", month],
    enabled: operator && /^\d{4}-\d{2}$/.test(month),
    queryFn: () => api.get<EfficiencyRanking>("usage/efficiency-ranking", { month }),
  });
  const data = statement.data;
  return (
    <Stack>
      <Title order={1}>Efficiency</Title>
      <Text size="sm" c="dimmed">
        How well the GPUs a project held were used in a UTC month: utilization weighted by time, the credits spent on idle
        GPUs, energy and what the facility's power cost, beside the previous month and the whole fleet. SM and tensor
        activity are DCGM profiling readings, the evidence of work that utilization is not; GPUs without them say "not
        measured".
      </Text>
      <Group align="flex-end">
        <ProjectPicker value={project} onChange={setProject} choices={choices} />
        <TextInput type="month" label="Month (UTC)" value={month} onChange={(e) => setMonth(e.currentTarget.value)} />
        {data && (
          <Button component="a" variant="default" href={buildUrl("usage/efficiency.csv", query)} download data-testid="efficiency-csv">
            Download CSV
          </Button>
        )}
      </Group>
      <QueryState isLoading={!!project && statement.isLoading} error={statement.error} label="the efficiency statement">
        {data && (
          <>
            {data.provisional && (
              <Alert color="yellow" title="Provisional" styles={{ title: { color: "var(--mantine-color-dark-9)" } }}>
                The month's last hours are still being rolled up; its figures may still move.
              </Alert>
            )}
            <SimpleGrid cols={{ base: 2, sm: 3, lg: 7 }} data-testid="efficiency-totals">
              <Stat label="Mean utilization" value={formatPercent(data.totals.util_mean_percent)}
                note={compare(data.totals.util_mean_percent, data.previous.util_mean_percent, { higherIsBetter: true }) + " than last month"} />
              <Stat label="Idle share" value={formatShare(data.totals.idle_share)}
                note={compare(data.totals.idle_share, data.fleet.idle_share, { higherIsBetter: false, scale: 100 }) + " than the fleet"} />
              <Stat label="Credits on idle GPUs" value={`${formatCredits(data.totals.idle_credits)} of ${formatCredits(data.totals.credits)}`} />
              <Stat label={`GPU-hours under ${data.low_util_percent}%`} value={formatShare(data.totals.low_util_share)} />
              <Stat label="Energy per GPU-hour" value={data.totals.energy_wh_per_gpu_hour == null ? "–" : `${data.totals.energy_wh_per_gpu_hour.toFixed(0)} Wh`} />
              <Stat label="SM active (profiling)" value={formatProfiling(data.totals.sm_active_percent, data.totals.profiling)}
                note={data.totals.profiling === "not measured" ? "Utilization only: no GPM readings" :
                  `Tensor pipes: ${formatProfiling(data.totals.tensor_active_percent, data.totals.profiling)}`} />
              <Stat label="Facility energy / cost" value={`${data.totals.facility_energy_kwh.toFixed(2)} kWh / ${data.totals.energy_cost} ${data.totals.energy_currency}`}
                note={`GPUs: ${data.totals.energy_kwh.toFixed(2)} kWh`} />
            </SimpleGrid>
            <Card withBorder>
              <Title order={2} size="h4" mb="xs">Against the previous month and the fleet</Title>
              <FiguresTable rows={[
                { label: `This month (${data.period})`, figures: data.totals },
                { label: `Previous month (${data.previous.period})`, figures: data.previous },
                { label: "Fleet", figures: data.fleet },
              ]} label="Comparison" />
            </Card>
            <Card withBorder>
              <Title order={2} size="h4" mb="xs">Reservations ranked by waste</Title>
              <Text size="xs" c="dimmed" mb="xs">Waste: credits spent while the GPUs were idle, then idle GPU-hours.</Text>
              {data.reservations.length === 0 ? (
                <Text c="dimmed" size="sm" ta="center" p="md">No GPU-hours held this month.</Text>
              ) : (
                <FiguresTable label="Reservations ranked by waste" rows={data.reservations.map((r) => ({
                  label: r.name || "(no name)",
                  link: r.reservation ? `/reservations/${r.reservation}` : undefined,
                  figures: r,
                }))} />
              )}
            </Card>
          </>
        )}
      </QueryState>
      {operator && (
        <Card withBorder>
          <Title order={2} size="h4" mb="xs">All projects, ranked by waste ({month})</Title>
          <QueryState isLoading={ranking.isLoading} error={ranking.error} isEmpty={ranking.data?.projects.length === 0}
            empty="No project held GPUs this month." label="the ranking">
            <FiguresTable label="Projects ranked by waste" rows={[
              ...(ranking.data?.projects ?? []).map((p) => ({ label: `${p.rank}. ${p.project}`, figures: p })),
              ...(ranking.data ? [{ label: "Fleet", figures: ranking.data.fleet }] : []),
            ]} />
            {ranking.data && (
              <Button component="a" variant="default" mt="sm" href={buildUrl("usage/efficiency-ranking.csv", { month })} download>
                Download ranking CSV
              </Button>
            )}
          </QueryState>
        </Card>
      )}
    </Stack>
  );
}

function FiguresTable({ rows, label }: { rows: { label: string; link?: string; figures: EfficiencyFigures }[]; label: string }) {
  return (
    <ResponsiveTable minWidth={1040} striped aria-label={label}>
      <Table.Thead>
        <Table.Tr>
          <Table.Th>Name</Table.Th><Table.Th>Held GPU-h</Table.Th><Table.Th>Utilization</Table.Th>
          <Table.Th>SM active (profiling)</Table.Th><Table.Th>Tensor active (profiling)</Table.Th><Table.Th>Idle</Table.Th>
          <Table.Th>Under the line</Table.Th><Table.Th>Credits</Table.Th><Table.Th>On idle</Table.Th><Table.Th>Facility kWh</Table.Th><Table.Th>Energy cost</Table.Th>
        </Table.Tr>
      </Table.Thead>
      <Table.Tbody>
        {rows.map((r) => (
          <Table.Tr key={r.label + (r.link ?? "")}>
            <Table.Td data-label="Name">{r.link ? <Anchor component={Link} to={r.link}>{r.label}</Anchor> : r.label}</Table.Td>
            <Table.Td data-label="Held GPU-h">{r.figures.held_gpu_hours.toFixed(2)}</Table.Td>
            <Table.Td data-label="Utilization">{formatPercent(r.figures.util_mean_percent)}</Table.Td>
            <Table.Td data-label="SM active (profiling)" data-testid="efficiency-sm">
              {formatProfiling(r.figures.sm_active_percent, r.figures.profiling)}
            </Table.Td>
            <Table.Td data-label="Tensor active (profiling)">
              {formatProfiling(r.figures.tensor_active_percent, r.figures.profiling)}
            </Table.Td>
            <Table.Td data-label="Idle">{formatShare(r.figures.idle_share)}</Table.Td>
            <Table.Td data-label="Under the line">{formatShare(r.figures.low_util_share)}</Table.Td>
            <Table.Td data-label="Credits">{formatCredits(r.figures.credits)}</Table.Td>
            <Table.Td data-label="On idle">{formatCredits(r.figures.idle_credits)}</Table.Td>
            <Table.Td data-label="Facility kWh">{r.figures.facility_energy_kwh.toFixed(2)}</Table.Td>
            <Table.Td data-label="Energy cost">{`${r.figures.energy_cost} ${r.figures.energy_currency}`}</Table.Td>
          </Table.Tr>
        ))}
      </Table.Tbody>
    </ResponsiveTable>
  );
}

function Stat({ label, value, note }: { label: string; value: string; note?: string }) {
  return (
    <Card withBorder p="sm">
      <Text size="xs" c="dimmed">{label}</Text>
      <Text size="lg" fw={700}>{value}</Text>
      {note && <Text size="xs" c="dimmed">{note}</Text>}
    </Card>
  );
}
