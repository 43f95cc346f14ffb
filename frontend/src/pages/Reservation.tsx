import {
  Anchor,
  Button,
  Card,
  Code,
  Grid,
  Group,
  Modal,
  SimpleGrid,
  Stack,
  Table,
  Text,
  TextInput,
  Timeline as MTimeline,
  Title,
} from "@mantine/core";
import { LineChart } from "@mantine/charts";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useEffect, useState } from "react";
import { Link, useParams } from "react-router";

import { ApiError, api, isMissingEndpoint } from "../api/client";
import { pollUnlessRefused } from "../api/hooks";
import type { ReservationDetail, ReservationTelemetry } from "../api/types";
import { SimulatedBadge, StateBadge } from "../components/Badges";
import { ConnectPanel } from "../components/ConnectPanel";
import { LogPanel } from "../components/LogPanel";
import { ErrorAlert, NotAvailable, QueryState } from "../components/QueryState";
import { formatDateTime, formatRelative, fromLocalInput, shortUuid, toLocalInput } from "../lib/format";
import { TELEMETRY_CHARTS, chartData, gpuLabel, rememberLatest, telemetrySince, type RecentSamples } from "../lib/telemetry";

const POLL_MS = 3_000;

function isSession(data: unknown): boolean {
  return typeof data === "object" && data !== null && (data as { kind?: unknown }).kind === "ssh_session";
}

export function ReservationPage() {
  const { id } = useParams();
  const reservation = useQuery({
    queryKey: ["reservation", id],
    queryFn: () => api.get<ReservationDetail>(`reservations/${id}/`),
    refetchInterval: pollUnlessRefused(POLL_MS),
  });
  const r = reservation.data;
  return (
    <Stack>
      <Group gap="xs">
        <Anchor component={Link} to="/" size="sm">
          Dashboard
        </Anchor>
        <Text size="sm" c="dimmed">/ reservation</Text>
      </Group>
      <QueryState isLoading={reservation.isLoading} error={reservation.error} label="the reservation">
        {r && <ReservationView r={r} />}
      </QueryState>
    </Stack>
  );
}

function ReservationView({ r }: { r: ReservationDetail }) {
  const live = ["starting", "running", "ending"].includes(r.state);
  return (
    <Stack>
      <Group justify="space-between" align="flex-start">
        <div>
          <Group gap="sm">
            <Title order={2}>{r.name}</Title>
            <StateBadge state={r.state} />
          </Group>
          <Text size="sm" c="dimmed">
            {r.project} · {formatDateTime(r.starts_at)} – {formatDateTime(r.ends_at)} · starts {formatRelative(r.starts_at)}, ends{" "}
            {formatRelative(r.ends_at)}
          </Text>
          <Text size="sm" c="dimmed">
            <Code>{r.image}</Code> {r.command?.length ? <Code>{r.command.join(" ")}</Code> : null}
          </Text>
          {(r.volumes?.length > 0 || (r.network && r.network !== "none")) && (
            <Text size="sm" c="dimmed">
              {r.volumes.map((m) => (
                <span key={m.path}>
                  {m.kind} <Code>{m.name}</Code> at <Code>{m.path}</Code>
                  {m.read_only ? " (read-only)" : ""} ·{" "}
                </span>
              ))}
              network <Code>{r.network || "none"}</Code>
            </Text>
          )}
        </div>
        <Actions r={r} />
      </Group>

      <ConnectPanel access={r.access} reservationId={r.id} />

      <Grid>
        <Grid.Col span={{ base: 12, md: 7 }}>
          <Card withBorder>
            <Text fw={600} mb="xs">GPUs</Text>
            <Allocations r={r} />
          </Card>
        </Grid.Col>
        <Grid.Col span={{ base: 12, md: 5 }}>
          <Card withBorder>
            <Text fw={600} mb="xs">Events</Text>
            <MTimeline bulletSize={14} lineWidth={2} active={r.events.length}>
              {r.events.map((e, i) => (
                <MTimeline.Item key={i} title={isSession(e.data) ? "SSH session" : `${e.from_state || "new"} → ${e.to_state}`}>
                  <Text size="xs" c="dimmed">
                    {formatDateTime(e.at)} · {e.actor_label || "system"}
                  </Text>
                  {e.reason && <Text size="xs">{e.reason}</Text>}
                </MTimeline.Item>
              ))}
            </MTimeline>
          </Card>
        </Grid.Col>
      </Grid>

      <Card withBorder>
        <Group justify="space-between" mb="xs">
          <Text fw={600}>Live telemetry</Text>
          <Text size="xs" c="dimmed">polled every {POLL_MS / 1000} s</Text>
        </Group>
        {live || r.allocations.length > 0 ? (
          <TelemetryCharts r={r} />
        ) : (
          <Text c="dimmed" size="sm">No GPUs are allocated.</Text>
        )}
      </Card>

      <Card withBorder>
        <Text fw={600} mb="xs">Container</Text>
        <Launches r={r} />
      </Card>

      <LogPanel reservationId={r.id} />
    </Stack>
  );
}

function Allocations({ r }: { r: ReservationDetail }) {
  // The telemetry answer says which GPUs are simulated, to tenants too; the query is shared with the charts.
  const telemetry = useReservationTelemetry(r);
  const simulated = new Set((telemetry.data?.gpus ?? []).filter((g) => g.simulated).map((g) => g.server));
  if (r.allocations.length === 0) return <Text c="dimmed" size="sm">No GPUs allocated yet.</Text>;
  return (
    <Table.ScrollContainer minWidth={420}>
      <Table>
        <Table.Thead>
          <Table.Tr>
            <Table.Th>Server</Table.Th>
            <Table.Th>GPU</Table.Th>
            <Table.Th>Model</Table.Th>
            <Table.Th>UUID</Table.Th>
            <Table.Th>Held</Table.Th>
          </Table.Tr>
        </Table.Thead>
        <Table.Tbody>
          {r.allocations.map((a) => (
            <Table.Tr key={`${a.gpu}-${a.starts_at}`}>
              <Table.Td>
                <Group gap={4}>
                  {a.server} {simulated.has(a.server) && <SimulatedBadge />}
                </Group>
              </Table.Td>
              <Table.Td>{a.index}</Table.Td>
              <Table.Td>{a.gpu_model}</Table.Td>
              <Table.Td title={a.gpu}>{shortUuid(a.gpu)}</Table.Td>
              <Table.Td>{a.active ? "yes" : a.released_at ? `released ${formatRelative(a.released_at)}` : "no"}</Table.Td>
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  );
}

const COLORS = ["blue.6", "teal.6", "orange.6", "grape.6", "red.6", "cyan.6", "lime.6", "indigo.6"];
const POLLED_STATES = ["starting", "running", "ending"];

function useReservationTelemetry(r: ReservationDetail) {
  return useQuery({
    queryKey: ["reservation-telemetry", r.id],
    queryFn: async () => {
      // Recomputed on every poll, so the charts keep a sliding hour while the reservation runs.
      const since = telemetrySince(r, Date.now());
      if (since === null) return null;
      return api.get<ReservationTelemetry>(`reservations/${r.id}/telemetry/`, { since });
    },
    refetchInterval: POLLED_STATES.includes(r.state) ? POLL_MS : false,
  });
}

/** Clock times for the x axis, with seconds while the chart spans only a few minutes. */
function clock(t: number, rows: Record<string, number>[]): string {
  const span = rows.length ? rows[rows.length - 1].t - rows[0].t : 0;
  const opts: Intl.DateTimeFormatOptions =
    span < 10 * 60_000 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
  return new Date(t).toLocaleTimeString("en-GB", opts);
}

function TelemetryCharts({ r }: { r: ReservationDetail }) {
  const telemetry = useReservationTelemetry(r);
  const [recent, setRecent] = useState<RecentSamples>({});
  useEffect(() => {
    if (telemetry.data) setRecent((before) => rememberLatest(before, telemetry.data!.gpus));
  }, [telemetry.data]);
  if (telemetry.isLoading) return <Text size="sm" c="dimmed">Loading telemetry…</Text>;
  if (telemetry.error) return <ErrorAlert error={telemetry.error} title="Could not load telemetry" />;
  const data = telemetry.data;
  if (data === null || data === undefined) {
    return (
      <Text size="sm" c="dimmed" data-testid="telemetry-empty">
        {Date.parse(r.starts_at) > Date.now()
          ? "The charts start when the reservation's window opens."
          : "This window closed more than a day ago; the usage report has its totals."}
      </Text>
    );
  }
  const charts = TELEMETRY_CHARTS.map((c) => ({ ...c, ...chartData(data.gpus, c.key, recent) }));
  const simulated = data.gpus.filter((g) => g.simulated).map(gpuLabel);
  const latestAt = data.gpus.map((g) => g.latest?.at).filter((a): a is string => !!a).sort().pop();
  if (charts.every((c) => c.rows.length === 0)) {
    return (
      <Text size="sm" c="dimmed" data-testid="telemetry-empty">
        {POLLED_STATES.includes(r.state) ? "No samples yet; the agent reports every few seconds." : "No samples were recorded in this window."}
      </Text>
    );
  }
  return (
    <Stack>
      <Group gap="xs">
        {simulated.length > 0 && (
          <Group gap={4} data-testid="telemetry-simulated">
            <SimulatedBadge />
            <Text size="xs" c="dimmed">
              {simulated.length === data.gpus.length ? "All" : simulated.join(", ")} of these figures come from simulated GPUs.
            </Text>
          </Group>
        )}
        <Text size="xs" c="dimmed">
          Per-minute means (memory: peak) since {formatDateTime(data.since)}, then the samples polled since
          {latestAt ? ` (latest ${new Date(latestAt).toLocaleTimeString("en-GB")})` : ""}.
        </Text>
      </Group>
      <SimpleGrid cols={{ base: 1, md: 3 }} data-testid="telemetry-charts">
        {charts.map((c) => (
          <div key={c.key} data-testid={`telemetry-chart-${c.key}`} data-points={c.rows.length}>
            <Text size="sm" fw={500}>{c.title}</Text>
            <Text size="xs" c="dimmed">{c.dcgm}</Text>
            {c.rows.length === 0 ? (
              <Text size="xs" c="dimmed" h={180}>This GPU does not report it.</Text>
            ) : (
              <LineChart
                h={180}
                data={c.rows}
                dataKey="t"
                series={c.series.map((l, i) => ({
                  name: l,
                  label: simulated.includes(l) ? `${l} (simulated)` : l,
                  color: COLORS[i % COLORS.length],
                }))}
                xAxisProps={{
                  type: "number",
                  scale: "time",
                  domain: ["dataMin", "dataMax"],
                  tickFormatter: (t: number) => clock(t, c.rows),
                }}
                tooltipProps={{ labelFormatter: (t: number) => new Date(t).toLocaleTimeString("en-GB") }}
                unit={c.unit}
                withDots={c.rows.length < 3}
                curveType="linear"
                connectNulls
                withLegend={c.series.length <= 8}
              />
            )}
          </div>
        ))}
      </SimpleGrid>
    </Stack>
  );
}

interface Launch {
  launch_id?: string;
  state?: string;
  exit_code?: number | null;
  log_tail?: string | null;
  error?: string | null;
  server?: string;
  started_at?: string | null;
  finished_at?: string | null;
  [key: string]: unknown;
}

async function fetchLaunches(id: string): Promise<Launch[] | null> {
  // Dispatch documents either route; whichever this server has wins, 404 on both means "not built yet".
  const routes: [string, Record<string, string>?][] = [[`reservations/${id}/launches/`], ["launches/", { reservation: id }]];
  for (const [path, query] of routes) {
    try {
      const data = await api.get<Launch[] | { results: Launch[] }>(path, query);
      return Array.isArray(data) ? data : data.results;
    } catch (e) {
      if (!isMissingEndpoint(e)) throw e;
    }
  }
  return null;
}

function Launches({ r }: { r: ReservationDetail }) {
  const launches = useQuery({
    queryKey: ["launches", r.id],
    queryFn: () => fetchLaunches(r.id),
    refetchInterval: (q) => (q.state.data === null ? false : POLL_MS),
  });
  if (launches.isLoading) return <Text size="sm" c="dimmed">Loading…</Text>;
  if (launches.error) return <ErrorAlert error={launches.error} title="Could not load the container state" />;
  if (launches.data === null) return <NotAvailable what="Container state, exit code and log tail" />;
  if (!launches.data || launches.data.length === 0) {
    return <Text size="sm" c="dimmed">No container launched yet; it starts when the window opens.</Text>;
  }
  return (
    <Stack data-testid="launches">
      {launches.data.map((l, i) => (
        <div key={String(l.launch_id ?? i)}>
          <Group gap="sm">
            {l.state && <StateBadge state={l.state} />}
            {l.server && <Text size="sm">{l.server}</Text>}
            <Text size="sm">exit code: <b>{l.exit_code ?? "–"}</b></Text>
            {l.started_at && <Text size="xs" c="dimmed">started {formatDateTime(l.started_at)}</Text>}
            {l.finished_at && <Text size="xs" c="dimmed">finished {formatDateTime(l.finished_at)}</Text>}
          </Group>
          {l.error && <Text size="sm" c="red">{String(l.error)}</Text>}
          {l.log_tail ? (
            <Code block className="logtail" mt={4}>{l.log_tail}</Code>
          ) : (
            <Text size="xs" c="dimmed">No log output yet.</Text>
          )}
        </div>
      ))}
    </Stack>
  );
}

function Actions({ r }: { r: ReservationDetail }) {
  const queryClient = useQueryClient();
  const [extendOpen, setExtendOpen] = useState(false);
  const [newEnd, setNewEnd] = useState(() => toLocalInput(new Date(Date.parse(r.ends_at) + 3_600_000)));
  const act = useMutation({
    mutationFn: ({ verb, body }: { verb: "cancel" | "release" | "extend"; body: object }) =>
      api.post<ReservationDetail>(`reservations/${r.id}/${verb}/`, body),
    onSuccess: (data) => {
      queryClient.setQueryData(["reservation", r.id], data);
      queryClient.invalidateQueries({ queryKey: ["reservations"] });
      queryClient.invalidateQueries({ queryKey: ["balances"] });
      setExtendOpen(false);
    },
  });
  const before = ["pending", "scheduled"].includes(r.state);
  const running = ["starting", "running"].includes(r.state);
  const extendError = act.error instanceof ApiError ? act.error.fieldError("ends_at") : undefined;
  return (
    <Stack gap="xs" align="flex-end">
      <Group gap="xs">
        {before && (
          <Button color="red" variant="light" loading={act.isPending}
            onClick={() => act.mutate({ verb: "cancel", body: { reason: "cancelled from the portal" } })}>
            Cancel reservation
          </Button>
        )}
        {running && (
          <Button color="orange" variant="light" loading={act.isPending}
            onClick={() => act.mutate({ verb: "release", body: { reason: "released early from the portal" } })}>
            Release now
          </Button>
        )}
        {(before || running) && (
          <Button variant="default" onClick={() => setExtendOpen(true)}>Extend</Button>
        )}
      </Group>
      {act.error && !extendOpen && <ErrorAlert error={act.error} title="The server refused" />}
      <Modal opened={extendOpen} onClose={() => setExtendOpen(false)} title="Extend the reservation">
        <Stack>
          <TextInput type="datetime-local" label="New end" value={newEnd} onChange={(e) => setNewEnd(e.currentTarget.value)}
            error={extendError} />
          {act.error && !extendError && <ErrorAlert error={act.error} title="The server refused" />}
          <Button
            onClick={() => {
              const d = fromLocalInput(newEnd);
              if (d) act.mutate({ verb: "extend", body: { ends_at: d.toISOString(), reason: "extended from the portal" } });
            }}
            loading={act.isPending}
          >
            Extend
          </Button>
        </Stack>
      </Modal>
    </Stack>
  );
}
