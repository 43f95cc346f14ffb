import {
  Alert,
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
import { useEffect, useRef, useState } from "react";
import { Link, useParams } from "react-router";

import { ApiError, api, isMissingEndpoint } from "../api/client";
import { useServers } from "../api/hooks";
import { DCGM, type ReservationDetail, type Server } from "../api/types";
import { SimulatedBadge, StateBadge } from "../components/Badges";
import { ErrorAlert, NotAvailable, QueryState } from "../components/QueryState";
import { ACTIVE_STATES, formatDateTime, formatRelative, fromLocalInput, shortUuid, toLocalInput } from "../lib/format";
import { appendSample, mergeSeries, type Sample } from "../lib/telemetry";

const POLL_MS = 3_000;

export function ReservationPage() {
  const { id } = useParams();
  const reservation = useQuery({
    queryKey: ["reservation", id],
    queryFn: () => api.get<ReservationDetail>(`reservations/${id}/`),
    refetchInterval: POLL_MS,
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
        </div>
        <Actions r={r} />
      </Group>

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
                <MTimeline.Item key={i} title={`${e.from_state || "new"} → ${e.to_state}`}>
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
    </Stack>
  );
}

function Allocations({ r }: { r: ReservationDetail }) {
  const servers = useServers();
  const simulated = new Set((servers.data ?? []).filter((s) => s.simulated).map((s) => s.hostname));
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

const CHARTS: { field: string; title: string; unit: string }[] = [
  { field: DCGM.util, title: "Utilization", unit: "%" },
  { field: DCGM.fbUsed, title: "Memory used", unit: " MiB" },
  { field: DCGM.power, title: "Power", unit: " W" },
];
const COLORS = ["blue.6", "teal.6", "orange.6", "grape.6", "red.6", "cyan.6", "lime.6", "indigo.6"];

function TelemetryCharts({ r }: { r: ReservationDetail }) {
  const servers = useServers(POLL_MS);
  const history = useRef<Record<string, Sample[]>>({});
  const [, bump] = useState(0);
  const mine = new Set(r.allocations.map((a) => a.gpu));
  const gpus = (servers.data ?? []).flatMap((s: Server) =>
    s.gpus.filter((g) => mine.has(g.uuid)).map((g) => ({ server: s, gpu: g })),
  );
  const exposed = gpus.some(({ gpu }) => "telemetry" in gpu);

  useEffect(() => {
    let changed = false;
    for (const { server, gpu } of gpus) {
      if (!gpu.telemetry || !gpu.telemetry_at) continue;
      const label = `${server.hostname}/${gpu.index}`;
      const sample: Sample = { t: Date.parse(gpu.telemetry_at) };
      for (const c of CHARTS) {
        const v = gpu.telemetry[c.field];
        if (typeof v === "number") sample[c.field] = v;
      }
      const before = history.current[label] ?? [];
      const after = appendSample(before, sample);
      if (after !== before) {
        history.current[label] = after;
        changed = true;
      }
    }
    if (changed) bump((n) => n + 1);
  }, [servers.dataUpdatedAt]); // eslint-disable-line react-hooks/exhaustive-deps

  if (servers.isLoading) return <Text size="sm" c="dimmed">Loading telemetry…</Text>;
  if (servers.error) return <ErrorAlert error={servers.error} title="Could not load telemetry" />;
  if (!exposed) {
    return (
      <Alert color="gray" title="Not available yet" data-testid="telemetry-not-available">
        Live GPU telemetry is not offered to this account by the API yet (the fleet endpoints show it to
        operators). Charts will appear here once the server provides it.
      </Alert>
    );
  }
  const labels = Object.keys(history.current).sort();
  if (labels.length === 0 || !["starting", "running", "ending"].includes(r.state)) {
    return (
      <Text size="sm" c="dimmed">
        {ACTIVE_STATES.has(r.state) && !["starting", "running", "ending"].includes(r.state)
          ? "The charts start when the reservation runs."
          : "No samples yet."}
        {labels.length > 0 && " Last samples are shown below."}
      </Text>
    );
  }
  const simulated = gpus.some(({ server }) => server.simulated);
  return (
    <Stack>
      {simulated && (
        <Group gap={4}>
          <SimulatedBadge />
          <Text size="xs" c="dimmed">These figures come from simulated GPUs.</Text>
        </Group>
      )}
      <SimpleGrid cols={{ base: 1, md: 3 }} data-testid="telemetry-charts">
        {CHARTS.map((c) => (
          <div key={c.field}>
            <Text size="sm" fw={500}>{c.title}</Text>
            <Text size="xs" c="dimmed">{c.field}</Text>
            <LineChart
              h={180}
              data={mergeSeries(history.current, c.field)}
              dataKey="t"
              series={labels.map((l, i) => ({ name: l, color: COLORS[i % COLORS.length] }))}
              xAxisProps={{ tickFormatter: (t: number) => new Date(t).toLocaleTimeString("en-GB") }}
              unit={c.unit}
              withDots={false}
              curveType="linear"
              withLegend={labels.length <= 8}
            />
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
