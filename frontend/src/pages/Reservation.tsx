import {
  Alert,
  Anchor,
  Badge,
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
import { Link, useLocation, useParams } from "react-router";

import { ApiError, api, isMissingEndpoint } from "../api/client";
import { pollUnlessRefused } from "../api/hooks";
import type { ExtendQuote, ReservationDetail, ReservationEvent, ReservationTelemetry } from "../api/types";
import { SimulatedBadge, StateBadge } from "../components/Badges";
import { ConfirmButton } from "../components/ConfirmButton";
import { ConnectPanel } from "../components/ConnectPanel";
import { LogPanel } from "../components/LogPanel";
import { TerminalPanel, WebAppsPanel } from "../components/WebApps";
import { megabytes, pullText, type PullProgress } from "../lib/logs";
import { IdleBanner } from "../components/IdleBanner";
import { ErrorAlert, NotAvailable, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import {
  formatCredits,
  formatDateTime,
  formatDuration,
  fromLocalInput,
  shortUuid,
  toLocalInput,
} from "../lib/format";
import {
  TELEMETRY_CHARTS,
  chartData,
  formatChartValue,
  gpuLabel,
  rememberLatest,
  seriesStyle,
  telemetrySince,
  type RecentSamples,
} from "../lib/telemetry";
import { preemptedBy } from "../lib/queue";
import { FINAL_STATES, heldText, whenText } from "../lib/reservation";
import { useNow } from "../lib/useNow";
import { secretUseText, warningsOf, warningText } from "../lib/secrets";

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

const FINAL = FINAL_STATES;

function ReservationView({ r }: { r: ReservationDetail }) {
  const live = ["starting", "running", "ending"].includes(r.state);
  const now = useNow(10_000);
  const [terminalOpen, setTerminalOpen] = useState(false);
  return (
    <Stack>
      <Group justify="space-between" align="flex-start">
        <div>
          <Group gap="sm">
            <Title order={1} size="h2">{r.name}</Title>
            <StateBadge state={r.state} />
            {r.preemptible && (
              <Badge color="grape" variant="light" data-testid="preemptible-badge">
                preemptible
              </Badge>
            )}
          </Group>
          {r.preemptible && (
            <Text size="sm" data-testid="preemptible-notice">
              Preemptible: it runs on GPUs nobody booked, at {multiplierText(r.credit_multiplier)} the rate, and yields
              them to a booking that needs them after {r.notice_seconds ?? 0} s of notice (SIGUSR1 and
              /run/gpucp/warning, then SIGTERM at the cut).
            </Text>
          )}
          {r.preempted_by && (
            <Text size="sm" data-testid="preempted-by">
              Preempted by{" "}
              <Anchor component={Link} to={`/reservations/${r.preempted_by}`}>
                reservation {shortUuid(r.preempted_by)}
              </Anchor>
            </Text>
          )}
          <Text size="sm" c="dimmed" data-testid="reservation-when">
            {r.project} · {formatDateTime(r.starts_at)} – {formatDateTime(r.ends_at)} · {whenText(r, now)}
          </Text>
          <Text size="sm" c="dimmed">
            <Code>{r.image}</Code> {r.command?.length ? <Code>{r.command.join(" ")}</Code> : null}
            {r.template ? (
              <span data-testid="reservation-template">
                {" "}· from template <Code>{r.template}</Code>
              </span>
            ) : null}
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

      <IdleBanner r={r} />

      <BookingWarnings />

      <CostPanel r={r} />

      <ConnectPanel access={r.access} reservationId={r.id} />

      <WebAppsPanel r={r} terminalOpen={terminalOpen} onTerminal={() => setTerminalOpen((o) => !o)} />

      {terminalOpen && <TerminalPanel r={r} onClose={() => setTerminalOpen(false)} />}

      <ResourcesPanel r={r} />

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
                <MTimeline.Item key={i} title={eventTitle(e)} data-testid={eventKind(e)}
                  className={preemptedBy(e.data) ? "event-preempted" : undefined}
                  color={preemptedBy(e.data) ? "grape" : undefined}>
                  <Text size="xs" c="dimmed">
                    {formatDateTime(e.at)} · {e.actor_label || "system"}
                  </Text>
                  <EventDetail e={e} />
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
        <Text size="sm" c="dimmed" mb="xs" ff="monospace">{r.image}</Text>
        {!!r.secrets?.length && (
          <Text size="sm" mb="xs" data-testid="reservation-secrets">
            Secrets: {r.secrets.map(secretUseText).join(", ")}
          </Text>
        )}
        <ImagePulls r={r} />
        <Launches r={r} />
      </Card>

      <LogPanel reservationId={r.id} />
    </Stack>
  );
}

/** The booking answer's warnings, handed over by the booking form (the answer alone holds them). */
function BookingWarnings() {
  const warnings = warningsOf(useLocation().state);
  if (warnings.length === 0) return null;
  return (
    <Alert color="yellow" title="Booked, with a warning" data-testid="booking-warnings">
      {warnings.map((w, i) => (
        <Text size="sm" key={i}>{warningText(w)}</Text>
      ))}
    </Alert>
  );
}

type EventData = Record<string, unknown>;

function eventData(e: ReservationEvent): EventData {
  return typeof e.data === "object" && e.data !== null ? (e.data as EventData) : {};
}

function isExtension(e: ReservationEvent): boolean {
  const d = eventData(e);
  return typeof d.old_ends_at === "string" && typeof d.ends_at === "string";
}

function eventKind(e: ReservationEvent): string {
  if (isSession(e.data)) return "event-session";
  if (preemptedBy(e.data)) return "event-preempted";
  if (isExtension(e)) return "event-extended";
  return `event-${e.to_state}`;
}

function eventTitle(e: ReservationEvent): string {
  if (isSession(e.data)) return "SSH session";
  if (preemptedBy(e.data)) return e.to_state === "cancelled" ? "Preempted before its start" : "Preempted: cut short";
  if (isExtension(e)) return "Extended";
  return `${e.from_state || "new"} → ${e.to_state}`;
}

/** What an event changed, from its data: an extension's old and new end, an early end, a charge. */
function EventDetail({ e }: { e: ReservationEvent }) {
  const d = eventData(e);
  const winner = preemptedBy(e.data);
  if (winner) {
    return (
      <Text size="xs" data-testid="event-preempted-by">
        For{" "}
        <Anchor component={Link} to={`/reservations/${winner}`} size="xs">
          reservation {shortUuid(winner)}
        </Anchor>
        {typeof d.ends_at === "string" ? `; ends ${formatDateTime(d.ends_at)}` : ""}
        {typeof d.booked_ends_at === "string" ? ` (booked until ${formatDateTime(d.booked_ends_at)})` : ""}
      </Text>
    );
  }
  if (isExtension(e)) {
    return (
      <Text size="xs" data-testid="event-extension-ends">
        End moved from {formatDateTime(String(d.old_ends_at))} to {formatDateTime(String(d.ends_at))}
        {typeof d.credits_held === "string" ? ` · ${formatCredits(d.credits_held)} more credits held` : ""}
      </Text>
    );
  }
  if (typeof d.booked_ends_at === "string" && typeof d.ends_at === "string") {
    return (
      <Text size="xs">
        Window cut to {formatDateTime(d.ends_at)} (booked until {formatDateTime(d.booked_ends_at)})
      </Text>
    );
  }
  if (typeof d.credits_charged === "string") {
    return <Text size="xs">{formatCredits(d.credits_charged)} credits charged</Text>;
  }
  return null;
}

/** The rate, the running cost while it runs, and the summary once it is over. */
function CostPanel({ r }: { r: ReservationDetail }) {
  const c = r.cost;
  const over = FINAL.includes(r.state);
  const started = c.elapsed_seconds > 0;
  return (
    <Card withBorder data-testid="cost-panel" aria-labelledby="cost-title">
      <Group justify="space-between" align="baseline">
        <Text fw={600} id="cost-title">Cost</Text>
        <Text size="sm" data-testid="cost-rate">
          {formatCredits(c.credits_per_hour)} credits/h
          {c.credit_multiplier && Number(c.credit_multiplier) !== 1 && (
            <span data-testid="cost-multiplier"> (its class's {multiplierText(c.credit_multiplier)} the booking rate)</span>
          )}
        </Text>
      </Group>
      {over ? (
        <Text size="sm" data-testid="cost-summary">
          {r.state === "completed" ? "Completed" : `Ended (${r.state})`}: {formatDuration(c.elapsed_seconds)},{" "}
          {formatCredits(c.gpu_hours)} GPU-h, {formatCredits(c.credits_charged)} credits
        </Text>
      ) : started ? (
        <Text size="sm" data-testid="cost-so-far">
          {formatCredits(c.credits_so_far)} credits so far ({formatDuration(c.elapsed_seconds)}, {formatCredits(c.gpu_hours)}{" "}
          GPU-h) of {formatCredits(c.booked_credits)} held for the booked window
        </Text>
      ) : (
        <Text size="sm" data-testid="cost-booked">
          Nothing used yet; {formatCredits(c.booked_credits)} credits are held for the booked window. Releasing early
          gives back what is not used.
        </Text>
      )}
    </Card>
  );
}

function Allocations({ r }: { r: ReservationDetail }) {
  // The telemetry answer says which GPUs are simulated, to tenants too; the query is shared with the charts.
  const telemetry = useReservationTelemetry(r);
  const simulated = new Set((telemetry.data?.gpus ?? []).filter((g) => g.simulated).map((g) => g.server));
  const now = useNow();
  if (r.allocations.length === 0) return <Text c="dimmed" size="sm">No GPUs allocated yet.</Text>;
  return (
    <ResponsiveTable minWidth={420} aria-label="GPUs">
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
            <Table.Td data-label="Server">
              <Group gap={4}>
                {a.server} {simulated.has(a.server) && <SimulatedBadge />}
              </Group>
            </Table.Td>
            <Table.Td data-label="GPU">{a.index}</Table.Td>
            <Table.Td data-label="Model">{a.gpu_model}</Table.Td>
            <Table.Td data-label="UUID" title={a.gpu}>{shortUuid(a.gpu)}</Table.Td>
            <Table.Td data-label="Held" data-testid="allocation-held">{heldText(a, now)}</Table.Td>
          </Table.Tr>
        ))}
      </Table.Tbody>
    </ResponsiveTable>
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
              <div className="telemetry-chart" data-series={c.series.join(",")} data-unit={c.unit.trim()}>
                <LineChart
                  h={200}
                  data={c.rows}
                  dataKey="t"
                  series={c.series.map((l, i) => ({
                    name: l,
                    label: simulated.includes(l) ? `${l} (sim.)` : l,
                    color: COLORS[i % COLORS.length],
                    ...seriesStyle(i, c.series.length),
                  }))}
                  // Each GPU's own width and dash: two GPUs with the same figures still show both lines.
                  lineProps={(series) => {
                    const i = c.series.indexOf(series.name);
                    return { strokeWidth: seriesStyle(i, c.series.length).strokeWidth };
                  }}
                  xAxisProps={{
                    type: "number",
                    scale: "time",
                    domain: ["dataMin", "dataMax"],
                    tickFormatter: (t: number) => clock(t, c.rows),
                  }}
                  yAxisProps={{ width: 64 }}
                  valueFormatter={(v: number) => formatChartValue(v, c)}
                  tooltipProps={{
                    labelFormatter: (t: number) => new Date(t).toLocaleTimeString("en-GB"),
                    allowEscapeViewBox: { x: false, y: false },
                    wrapperStyle: { zIndex: 3, maxWidth: "100%" },
                  }}
                  withDots={c.rows.length < 3}
                  curveType="linear"
                  connectNulls
                  withLegend={c.series.length <= 8}
                  legendProps={{ verticalAlign: "bottom", height: 40 }}
                />
              </div>
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
  image_digest?: string;
  oom_killed?: boolean;
  pull?: PullProgress | null;
  [key: string]: unknown;
}

interface ImagePull {
  server: string;
  image: string;
  state: "pulling" | "present" | "failed";
  digest: string;
  size_bytes: number | null;
  progress: PullProgress | null;
  error: string;
  reported_at: string;
}

/** The image pulled ahead of the window on each server: pulling, on the node (with its digest), or failed. */
function ImagePulls({ r }: { r: ReservationDetail }) {
  const pulls = useQuery({
    queryKey: ["image-pulls", r.id],
    queryFn: async () => {
      const data = await api.get<ImagePull[] | { results: ImagePull[] }>(`reservations/${r.id}/images/`);
      return Array.isArray(data) ? data : data.results;
    },
    refetchInterval: r.state === "scheduled" || r.state === "starting" ? POLL_MS : false,
  });
  if (!pulls.data || pulls.data.length === 0) return null;
  return (
    <Stack gap={4} data-testid="image-pulls">
      {pulls.data.map((p) => (
        <Group key={`${p.server}-${p.image}`} gap="sm">
          <Badge color={p.state === "failed" ? "red" : p.state === "present" ? "teal" : "blue"} variant="light">
            {p.state === "present" ? "image ready" : p.state === "failed" ? "pull failed" : "pulling"}
          </Badge>
          <Text size="sm">{p.server}</Text>
          {p.state === "pulling" && p.progress && <Text size="sm">{pullText(p.progress)}</Text>}
          {p.state === "present" && (
            <Text size="xs" c="dimmed" ff="monospace">
              {p.digest}
              {p.size_bytes !== null ? ` · ${megabytes(p.size_bytes)}` : ""}
              {p.progress ? ` · pulled in ${p.progress.seconds.toFixed(1)} s` : ""}
            </Text>
          )}
          {p.state === "failed" && <Text size="sm" c="red">{p.error}</Text>}
        </Group>
      ))}
    </Stack>
  );
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
            {l.oom_killed && <Badge color="red" data-testid="oom-killed">out of memory</Badge>}
          </Group>
          {l.pull && (
            <Text size="sm" data-testid="launch-pull">Pulling the image (it was not on the node): {pullText(l.pull)}</Text>
          )}
          {l.image_digest && (
            <Text size="xs" c="dimmed" ff="monospace" data-testid="launch-digest">ran {l.image_digest}</Text>
          )}
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

const QUICK_EXTENSIONS = [
  { label: "+1 h", ms: 3_600_000 },
  { label: "+4 h", ms: 4 * 3_600_000 },
  { label: "+1 day", ms: 24 * 3_600_000 },
];

function Actions({ r }: { r: ReservationDetail }) {
  const queryClient = useQueryClient();
  const [extendOpen, setExtendOpen] = useState(false);
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
  return (
    <Stack gap="xs" align="flex-end">
      <Group gap="xs">
        {before && (
          <ConfirmButton color="red" variant="light" title="Cancel this reservation?"
            message={<>Its GPUs go back to the pool and the {formatCredits(r.cost.booked_credits)} credits held for it are
              released. This cannot be undone; booking again may not find the same window free.</>}
            confirmLabel="Yes, cancel it" keepLabel="Keep the reservation" errorTitle="Could not cancel"
            onConfirm={() => act.mutateAsync({ verb: "cancel", body: { reason: "cancelled from the portal" } })}>
            Cancel reservation
          </ConfirmButton>
        )}
        {running && (
          <ConfirmButton color="orange" variant="light" title="Release the GPUs now?"
            message={<>The container is stopped and the window ends now; the project pays for the time used so far
              ({formatCredits(r.cost.credits_so_far)} credits) and gets the rest of the hold back. This cannot be undone.</>}
            confirmLabel="Release the GPUs" keepLabel="Keep it running" errorTitle="Could not release"
            onConfirm={() => act.mutateAsync({ verb: "release", body: { reason: "released early from the portal" } })}>
            Release now
          </ConfirmButton>
        )}
        {(before || running) && (
          <Button variant="default" onClick={() => { act.reset(); setExtendOpen(true); }}>Extend</Button>
        )}
      </Group>
      <Modal opened={extendOpen} onClose={() => setExtendOpen(false)} title="Extend the reservation" closeButtonProps={{ "aria-label": "Close" }}>
        {extendOpen && <ExtendForm r={r} act={act} />}
      </Modal>
    </Stack>
  );
}

type ActMutation = ReturnType<typeof useMutation<ReservationDetail, Error, { verb: "cancel" | "release" | "extend"; body: object }>>;

/** The new end, from a quick choice or typed; the quote says what it costs and whether its GPUs are free. */
function ExtendForm({ r, act }: { r: ReservationDetail; act: ActMutation }) {
  const currentEnd = Date.parse(r.ends_at);
  // A quick choice keeps the exact instant (the current end to the second, plus its hours); a typed end is
  // to the minute, as the field reads it.
  const [choice, setChoice] = useState<{ text: string; end: Date | null }>(() => {
    const end = new Date(currentEnd + QUICK_EXTENSIONS[0].ms);
    return { text: toLocalInput(end), end };
  });
  const newEnd = choice.text;
  const end = choice.end;
  const setNewEnd = (text: string) => setChoice({ text, end: fromLocalInput(text) });
  const pick = (d: Date) => setChoice({ text: toLocalInput(d), end: d });
  const iso = end ? end.toISOString() : null;
  const quote = useQuery({
    queryKey: ["extend-quote", r.id, r.ends_at, iso],
    queryFn: () => api.get<ExtendQuote>(`reservations/${r.id}/extend-quote/`, { ends_at: iso }),
    enabled: iso !== null && end !== null && end.getTime() > currentEnd,
    staleTime: 5_000,
  });
  const q = quote.data;
  const extendError = act.error instanceof ApiError ? act.error.fieldError("ends_at") : undefined;
  const tooEarly = end !== null && end.getTime() <= currentEnd;
  return (
    <Stack>
      <Text size="sm">Now ends {formatDateTime(r.ends_at)}.</Text>
      <Group gap="xs" role="group" aria-label="Quick choices">
        {QUICK_EXTENSIONS.map((x) => {
          const pressed = end !== null && end.getTime() === currentEnd + x.ms;
          return (
            <Button key={x.label} size="xs" variant={pressed ? "filled" : "default"} aria-pressed={pressed}
              onClick={() => pick(new Date(currentEnd + x.ms))}>
              {x.label}
            </Button>
          );
        })}
      </Group>
      <TextInput type="datetime-local" label="New end" value={newEnd} onChange={(e) => setNewEnd(e.currentTarget.value)}
        error={extendError ?? (tooEarly ? "Choose a time after the current end." : undefined)} />
      <div aria-live="polite" data-testid="extend-quote">
        {quote.isFetching && !q && <Text size="sm" c="dimmed">Checking the GPUs and the price…</Text>}
        {quote.error && <ErrorAlert error={quote.error} title="Could not price the extension" />}
        {q && (
          <Stack gap={4}>
            <Text size="sm" data-testid="extend-cost">
              +{formatDuration(Number(q.extra_hours) * 3600)}: {formatCredits(q.extra_credits)} more credits (at{" "}
              {formatCredits(q.credits_per_hour)} credits/h)
            </Text>
            <Text size="sm" fw={500} data-testid="extend-free">
              {q.gpus_free ? "✓ The same GPUs are free until then." : "✗ The same GPUs are not free until then."}
            </Text>
            {q.refusal && (
              <Alert color={q.gpus_free ? "orange" : "red"} p="xs" data-testid="extend-refusal">
                <Text size="sm">{q.refusal.message}</Text>
                {q.refusal.free_until && Date.parse(q.refusal.free_until) > currentEnd && (
                  <Button size="xs" variant="light" mt="xs"
                    onClick={() => pick(new Date(Date.parse(q.refusal!.free_until!)))}>
                    Extend to {formatDateTime(q.refusal.free_until)} instead
                  </Button>
                )}
              </Alert>
            )}
            {q.warnings.map((w) => (
              <Alert key={w.code} color="yellow" p="xs" data-testid="extend-warning">
                <Text size="sm">{w.message}</Text>
              </Alert>
            ))}
          </Stack>
        )}
      </div>
      {act.error && !extendError && <ErrorAlert error={act.error} title="The server refused" />}
      <Button
        onClick={() => {
          if (iso) act.mutate({ verb: "extend", body: { ends_at: iso, reason: "extended from the portal" } });
        }}
        disabled={!iso || tooEarly || (q !== undefined && !q.allowed)}
        loading={act.isPending}
      >
        Extend
      </Button>
    </Stack>
  );
}

/** A class's price factor in words: "0.5 ×". */
function multiplierText(m: string | undefined): string {
  return `${m ? Number(m).toLocaleString("en-US", { maximumFractionDigits: 3 }) : "1"} ×`;
}

function mib(n: number): string {
  return n >= 1024 ? `${(n / 1024).toFixed(n % 1024 === 0 ? 0 : 1)} GiB` : `${n} MiB`;
}

function ulimitText(u: { name: string; soft: number; hard: number }): string {
  const v = (x: number) => (x === -1 ? "unlimited" : String(x));
  return u.soft === u.hard ? `${u.name} ${v(u.soft)}` : `${u.name} ${v(u.soft)}:${v(u.hard)}`;
}

/** What the container gets besides its GPUs, per server, by the operator's policy (docs/reservations.md). */
function ResourcesPanel({ r }: { r: ReservationDetail }) {
  const rows = r.container_resources ?? [];
  if (rows.length === 0) return null;
  return (
    <Card withBorder data-testid="container-resources">
      <Text fw={600} mb="xs">Container resources</Text>
      <ResponsiveTable minWidth={520} aria-label="Container resources">
        <Table.Thead>
          <Table.Tr>
            <Table.Th>Server</Table.Th>
            <Table.Th>GPU share</Table.Th>
            <Table.Th>CPUs</Table.Th>
            <Table.Th>Memory</Table.Th>
            <Table.Th>/dev/shm</Table.Th>
            <Table.Th>Ulimits</Table.Th>
          </Table.Tr>
        </Table.Thead>
        <Table.Tbody>
          {rows.map((c) => (
            <Table.Tr key={c.server}>
              <Table.Td data-label="Server">{c.server}</Table.Td>
              <Table.Td data-label="GPU share">{Math.round(c.gpu_share * 1000) / 10}%</Table.Td>
              <Table.Td data-label="CPUs">{c.cpus ?? "not limited"}</Table.Td>
              <Table.Td data-label="Memory">{c.memory_mib === null ? "not limited" : mib(c.memory_mib)}</Table.Td>
              <Table.Td data-label="/dev/shm">{mib(c.shm_mib)}</Table.Td>
              <Table.Td data-label="Ulimits">{c.ulimits.map(ulimitText).join(", ") || "-"}</Table.Td>
            </Table.Tr>
          ))}
        </Table.Tbody>
      </ResponsiveTable>
      {rows.flatMap((c) => c.notes.map((n) => `${c.server}: ${n}`)).map((n) => (
        <Text key={n} size="xs" c="dimmed">
          {n}
        </Text>
      ))}
    </Card>
  );
}
