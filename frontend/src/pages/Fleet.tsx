import { Alert, Anchor, Badge, Button, Card, Checkbox, Group, List, Modal, SegmentedControl, SimpleGrid, Stack, Table, Text, TextInput, Title, Tooltip } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";

import { ApiError, api } from "../api/client";
import { useServers } from "../api/hooks";
import { DCGM, type Server, type ServerGpu, type ServerPower, type ServerState } from "../api/types";
import { SimulatedBadge, StateBadge } from "../components/Badges";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatDateTime, formatRelative } from "../lib/format";
import { explainReason, heatCell, reasonList } from "../lib/gpuHealth";
import { shownZone } from "../lib/report";
import { migSummary, parseMigLayout, vendorLabel } from "../lib/vendor";

type Metric = "util" | "temp";

/** GET servers/: operators also get who holds each GPU now. */
interface GpuInUse {
  reservation: string;
  name: string;
  project: string;
  project_name: string;
  state: string;
  starts_at: string;
  ends_at: string;
}
type FleetGpu = ServerGpu & { in_use?: GpuInUse | null };

/** GET servers/{id}/drain-preview/ */
interface DrainPreview {
  server: string;
  state: string;
  reservations: (GpuInUse & { running: boolean; gpus: number[] })[];
  unhealthy_gpus: number[];
}

// Tooltips open on keyboard focus as well as on hover.
const TOOLTIP_EVENTS = { hover: true, focus: true, touch: true };

export function FleetPage() {
  const servers = useServers(5_000);
  const [metric, setMetric] = useState<Metric>("util");
  const [acting, setActing] = useState<{ server: Server; to: ServerState } | null>(null);
  const [acknowledging, setAcknowledging] = useState<{ server: Server; gpu: FleetGpu } | null>(null);
  const [slicing, setSlicing] = useState<Server | null>(null);
  const list = servers.data ?? [];
  const gpus = list.flatMap((s) => s.gpus as FleetGpu[]);
  const unhealthy = list.flatMap((s) => (s.gpus as FleetGpu[]).filter((g) => g.health !== "healthy" || !g.present).map((g) => ({ s, g })));
  const until = `Until (${shownZone()})`;
  const inUse = list.flatMap((s) => (s.gpus as FleetGpu[]).filter((g) => g.in_use).map((g) => ({ s, g, use: g.in_use! })));

  return (
    <Stack>
      <Title order={1}>Fleet health</Title>
      <QueryState isLoading={servers.isLoading} error={servers.error} isEmpty={list.length === 0}
        empty="No servers are enrolled. Create a join token and start an agent." label="servers">
        <SimpleGrid cols={{ base: 2, sm: 5 }}>
          <Stat label="Servers" value={list.length} />
          <Stat label="Ready" value={list.filter((s) => s.state === "ready").length} />
          <Stat label="GPUs" value={gpus.length} />
          <Stat label="GPUs in use now" value={inUse.length} />
          <Stat label="Unhealthy GPUs" value={unhealthy.length} color={unhealthy.length ? "red.9" : undefined} />
        </SimpleGrid>

        <Card withBorder>
          <Group justify="space-between" mb="xs">
            <Title order={2} size="h4">GPU heatmap</Title>
            <SegmentedControl size="xs" value={metric} onChange={(v) => setMetric(v as Metric)} aria-label="Heatmap metric"
              data={[{ value: "util", label: "Utilization" }, { value: "temp", label: "Temperature" }]} />
          </Group>
          <Text size="xs" c="dimmed" mb="xs" data-testid="heatmap-legend">
            {metric === "util" ? "Pale: idle; deep blue: busy." : "Pale blue: cool; deep red: hot."} A red frame marks an
            unhealthy GPU, a dot one held by a reservation. Focus or hover a GPU for its details.
          </Text>
          <Stack gap="sm" data-testid="heatmap">
            {list.map((s) => (
              <div key={s.id}>
                <Group gap="xs" mb={4}>
                  <Text size="sm" fw={500}>{s.hostname}</Text>
                  {s.simulated && <SimulatedBadge />}
                </Group>
                <div className="heat-grid">
                  {(s.gpus as FleetGpu[]).map((g) => <HeatCell key={g.uuid} gpu={g} metric={metric} />)}
                </div>
              </div>
            ))}
          </Stack>
        </Card>

        <Card withBorder>
          <Title order={2} size="h4" mb="xs">Servers</Title>
          <ResponsiveTable minWidth={820} striped aria-label="Servers">
            <Table.Thead>
              <Table.Tr>
                <Table.Th>Host</Table.Th><Table.Th>State</Table.Th><Table.Th>GPUs</Table.Th>
                <Table.Th>Power (drawn / rated)</Table.Th>
                <Table.Th>Last heartbeat</Table.Th><Table.Th>Agent</Table.Th><Table.Th>Actions</Table.Th>
              </Table.Tr>
            </Table.Thead>
            <Table.Tbody>
              {list.map((s) => (
                <Table.Tr key={s.id} data-testid={`server-${s.hostname}`}>
                  <Table.Td data-label="Host">
                    <Group gap={4}>{s.hostname} {s.simulated && <SimulatedBadge />}</Group>
                  </Table.Td>
                  <Table.Td data-label="State"><StateBadge state={s.state} /></Table.Td>
                  <Table.Td data-label="GPUs">
                    {s.gpus.length} × {s.gpus[0]?.model ?? "?"}
                    {s.gpus.length > 0 && <Badge variant="default" ml={4} size="xs" data-testid="vendor">{vendorLabel(s.gpus)}</Badge>}
                    {s.gpus.some((g) => g.mig_mode?.current) && (
                      <Text span size="xs" c="dimmed" ml={4} title={s.gpus.map((g) => `GPU ${g.index}: ${migSummary(g) ?? "no MIG"}`).join("\n")}>
                        MIG on {s.gpus.filter((g) => g.mig_mode?.current).length} GPU(s)
                      </Text>
                    )}
                    {s.gpus.some((g) => g.health !== "healthy") && <Badge color="red.9" variant="filled" ml={4} size="xs">unhealthy</Badge>}
                  </Table.Td>
                  <Table.Td data-label="Power (drawn / rated)" data-testid={`power-${s.hostname}`}>{formatPower(s.power)}</Table.Td>
                  <Table.Td data-label="Last heartbeat" title={formatDateTime(s.last_heartbeat_at)}>{s.last_heartbeat_at ? formatRelative(s.last_heartbeat_at) : "never"}</Table.Td>
                  <Table.Td data-label="Agent">{s.agent_version || "–"}</Table.Td>
                  <Table.Td>
                    <Group gap={4} wrap="nowrap">
                      {s.state === "ready" && <Button size="xs" variant="default" onClick={() => setActing({ server: s, to: "draining" })}>Drain</Button>}
                      {s.state !== "maintenance" && s.state !== "retired" && <Button size="xs" variant="default" onClick={() => setActing({ server: s, to: "maintenance" })}>Maintenance</Button>}
                      {["draining", "maintenance", "commissioning"].includes(s.state) && <Button size="xs" variant="default" onClick={() => setActing({ server: s, to: "ready" })}>Return to ready</Button>}
                      {["draining", "maintenance"].includes(s.state) && s.gpus.some((g) => g.mig_mode) && (
                        <Button size="xs" variant="default" onClick={() => setSlicing(s)} aria-label={`MIG layout of ${s.hostname}`}>MIG</Button>
                      )}
                    </Group>
                  </Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </ResponsiveTable>
        </Card>

        <Card withBorder>
          <Title order={2} size="h4" mb="xs">GPUs in use</Title>
          {inUse.length === 0 ? (
            <Text size="sm" c="dimmed">No reservation holds a GPU right now.</Text>
          ) : (
            <ResponsiveTable minWidth={640} striped aria-label="GPUs in use" data-testid="gpus-in-use">
              <Table.Thead>
                <Table.Tr>
                  <Table.Th>GPU</Table.Th><Table.Th>Tenant (project)</Table.Th><Table.Th>Reservation</Table.Th>
                  <Table.Th>State</Table.Th><Table.Th>{until}</Table.Th>
                </Table.Tr>
              </Table.Thead>
              <Table.Tbody>
                {inUse.map(({ s, g, use }) => (
                  <Table.Tr key={g.uuid}>
                    <Table.Td data-label="GPU">{s.hostname} GPU {g.index}</Table.Td>
                    <Table.Td data-label="Tenant (project)">{use.project_name} ({use.project})</Table.Td>
                    <Table.Td data-label="Reservation"><Anchor component={Link} to={`/reservations/${use.reservation}`}>{use.name}</Anchor> <Text span size="xs" c="dimmed">{use.reservation.slice(0, 8)}</Text></Table.Td>
                    <Table.Td data-label="State"><StateBadge state={use.state} /></Table.Td>
                    <Table.Td data-label={until}>{formatDateTime(use.ends_at)}</Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </ResponsiveTable>
          )}
        </Card>

        <Card withBorder>
          <Title order={2} size="h4" mb="xs">Health</Title>
          {unhealthy.length === 0 ? (
            <Text size="sm" c="dimmed">Every GPU is healthy and present.</Text>
          ) : (
            <Stack gap="sm" data-testid="health-list">
              {unhealthy.map(({ s, g }) => (
                <Card key={g.uuid} withBorder p="xs" data-testid={`health-${s.hostname}-${g.index}`}>
                  <Group justify="space-between" align="flex-start" wrap="nowrap">
                    <div>
                      <Text size="sm" fw={600}>
                        {s.hostname} GPU {g.index}: {g.present ? g.health : "missing"}
                        {g.needs_acknowledgement && <Badge ml="xs" size="sm" color="red.9" variant="filled">needs acknowledgement</Badge>}
                      </Text>
                      <List size="sm" spacing={2}>
                        {reasonList(g.health_reasons).map((r) => (
                          <List.Item key={r}>{explainReason(r, g.telemetry?.[DCGM.temp])}</List.Item>
                        ))}
                        {reasonList(g.health_reasons).length === 0 && <List.Item>no reason recorded</List.Item>}
                      </List>
                    </div>
                    {g.needs_acknowledgement && (
                      <Button size="xs" color="red.9" onClick={() => setAcknowledging({ server: s, gpu: g })}
                        aria-label={`Acknowledge ${s.hostname} GPU ${g.index}`}>Acknowledge</Button>
                    )}
                  </Group>
                </Card>
              ))}
              <Text size="xs" c="dimmed">
                Hardware faults (XIDs, ECC errors) stay until acknowledged; acknowledging clears them, and the next heartbeat
                raises them again if the cause is still there. A temperature reason clears by itself.
              </Text>
            </Stack>
          )}
        </Card>
      </QueryState>
      {acting && <StateChange server={acting.server} to={acting.to} onClose={() => setActing(null)} />}
      {acknowledging && <Acknowledge server={acknowledging.server} gpu={acknowledging.gpu} onClose={() => setAcknowledging(null)} />}
      {slicing && <MigLayout server={slicing} onClose={() => setSlicing(null)} />}
    </Stack>
  );
}

function Stat({ label, value, color }: { label: string; value: number; color?: string }) {
  return (
    <Card withBorder p="sm">
      <Text size="xs" c="dimmed">{label}</Text>
      <Text size="xl" fw={700} c={color}>{value}</Text>
    </Card>
  );
}

/** Kept for callers that want one line of reasons. */
export function reasonsText(reasons: unknown): string {
  return reasonList(reasons).join("; ") || "no reason recorded";
}

function gpuSummary(gpu: FleetGpu): string {
  const t = gpu.telemetry ?? {};
  const util = t[DCGM.util];
  const temp = t[DCGM.temp];
  const parts = [`GPU ${gpu.index}`, gpu.present ? gpu.health : "missing", `utilization ${util ?? "–"}%`, `${temp ?? "–"} °C`];
  if (gpu.in_use) parts.push(`held by ${gpu.in_use.project} (reservation ${gpu.in_use.name})`);
  else parts.push("free");
  return parts.join(" · ");
}

function HeatCell({ gpu, metric }: { gpu: FleetGpu; metric: Metric }) {
  const t = gpu.telemetry ?? {};
  const util = t[DCGM.util];
  const temp = t[DCGM.temp];
  const value = metric === "util" ? util : temp;
  const colors = !gpu.present ? { background: "rgb(73 80 87)", color: "rgb(255 255 255)" } : metric === "util" ? heatCell(util, 100, "util") : heatCell(temp == null ? null : temp - 30, 60, "temp");
  const summary = gpuSummary(gpu);
  return (
    <Tooltip label={summary} events={TOOLTIP_EVENTS}>
      <div className="heat-cell" data-testid={`heat-${gpu.uuid}`}
        style={{ background: colors.background, color: colors.color, outline: gpu.health !== "healthy" ? "3px solid var(--mantine-color-red-9)" : undefined }}
        tabIndex={0} role="img" aria-label={summary}>
        <span>{gpu.index}{gpu.in_use ? " •" : ""}</span>
        <span>{value == null ? "–" : `${Math.round(value)}${metric === "util" ? "%" : "°"}`}</span>
      </div>
    </Tooltip>
  );
}

const MIG_CHANGE: Record<string, string> = {
  applying: "waiting for the agent",
  reset_required: "mode change pending a GPU reset",
  refused: "refused by the GPU",
};

/** An operator's MIG layout for one GPU of a drained server; the agent applies it and reports (docs/fractional.md). */
function MigLayout({ server, onClose }: { server: Server; onClose: () => void }) {
  const capable = server.gpus.filter((g) => g.mig_mode);
  const [index, setIndex] = useState(String(capable[0]?.index ?? ""));
  const [enabled, setEnabled] = useState(true);
  const [layout, setLayout] = useState("");
  const [reason, setReason] = useState("");
  const queryClient = useQueryClient();
  const gpu = capable.find((g) => String(g.index) === index);
  const change = useMutation({
    mutationFn: () =>
      api.post<ServerGpu>(`gpus/${gpu?.id}/mig/`, { enabled, layout: enabled ? parseMigLayout(layout) : [], reason }),
    onSuccess: () => {
      queryClient.invalidateQueries({ queryKey: ["servers"] });
      onClose();
    },
  });
  const err = change.error instanceof ApiError ? change.error : null;
  return (
    <Modal opened onClose={onClose} closeButtonProps={{ "aria-label": "Close" }} title={`MIG layout of ${server.hostname}`}>
      <form onSubmit={(e) => { e.preventDefault(); change.mutate(); }}>
        <Stack>
          <List size="sm">
            {capable.map((g) => (
              <List.Item key={g.uuid}>
                GPU {g.index}: {migSummary(g)}{g.mig_change ? ` (${MIG_CHANGE[g.mig_change] ?? g.mig_change})` : ""}
              </List.Item>
            ))}
          </List>
          <SegmentedControl aria-label="GPU" value={index} onChange={setIndex}
            data={capable.map((g) => ({ value: String(g.index), label: `GPU ${g.index}` }))} />
          <Checkbox label="MIG enabled" checked={enabled} onChange={(e) => setEnabled(e.currentTarget.checked)} />
          {enabled && (
            <TextInput label="GPU instances" description="Profiles joined by +, with counts: 3g.40gb+2x2g.20gb"
              value={layout} onChange={(e) => setLayout(e.currentTarget.value)} placeholder="3g.40gb+2x2g.20gb"
              error={err?.fieldError("layout")} />
          )}
          <TextInput label="Reason" value={reason} onChange={(e) => setReason(e.currentTarget.value)} placeholder="slices for the course" />
          <Text size="xs" c="dimmed">
            Only while nothing is booked on the GPU. The agent reconfigures on its next heartbeat and reports; return the
            server to ready after that.
          </Text>
          {change.error && !err?.fieldError("layout") && <ErrorAlert error={change.error} title="The server refused" />}
          <Button type="submit" loading={change.isPending} disabled={!gpu}>Apply</Button>
        </Stack>
      </form>
    </Modal>
  );
}

/** "1.75 / 3.20 kW (55%)": fresh readings only; a dash for what is not known. */
function formatPower(power: ServerPower | undefined): string {
  if (!power) return "–";
  const kw = (w: number | null) => (w == null ? "–" : (w / 1000).toFixed(2));
  const share = power.share == null ? "" : ` (${Math.round(power.share * 100)}%)`;
  return `${kw(power.drawn_w)} / ${kw(power.rated_w)} kW${share}`;
}

function Acknowledge({ server, gpu, onClose }: { server: Server; gpu: FleetGpu; onClose: () => void }) {
  const [reason, setReason] = useState("");
  const queryClient = useQueryClient();
  const ack = useMutation({
    mutationFn: () => api.post<ServerGpu>(`gpus/${gpu.id}/acknowledge/`, { reason }),
    onSuccess: () => {
      queryClient.invalidateQueries({ queryKey: ["servers"] });
      onClose();
    },
  });
  const err = ack.error instanceof ApiError ? ack.error : null;
  return (
    <Modal opened onClose={onClose} closeButtonProps={{ "aria-label": "Close" }} title={`Acknowledge the fault of ${server.hostname} GPU ${gpu.index}`}>
      <form onSubmit={(e) => { e.preventDefault(); ack.mutate(); }}>
        <Stack>
          <List size="sm">
            {reasonList(gpu.health_reasons).map((r) => <List.Item key={r}>{explainReason(r, gpu.telemetry?.[DCGM.temp])}</List.Item>)}
          </List>
          <Text size="sm" c="dimmed">
            Acknowledging says you have dealt with it: the hardware faults are cleared and the GPU takes reservations again
            unless the next heartbeat reports the fault again.
          </Text>
          <TextInput label="Reason" required data-autofocus value={reason} onChange={(e) => setReason(e.currentTarget.value)}
            placeholder="reseated the GPU, ran diagnostics" error={err?.fieldError("reason")} />
          {ack.error && !err?.fieldError("reason") && <ErrorAlert error={ack.error} title="The server refused" />}
          <Button type="submit" loading={ack.isPending}>Acknowledge</Button>
        </Stack>
      </form>
    </Modal>
  );
}

function StateChange({ server, to, onClose }: { server: Server; to: ServerState; onClose: () => void }) {
  const [reason, setReason] = useState("");
  const [anyway, setAnyway] = useState(false);
  const queryClient = useQueryClient();
  const preview = useQuery({
    queryKey: ["drain-preview", server.id],
    queryFn: () => api.get<DrainPreview>(`servers/${server.id}/drain-preview/`),
  });
  const change = useMutation({
    mutationFn: () => api.post<Server>(`servers/${server.id}/state/`, { state: to, reason }),
    onSuccess: () => {
      queryClient.invalidateQueries({ queryKey: ["servers"] });
      onClose();
    },
  });
  const err = change.error instanceof ApiError ? change.error : null;
  const verb = to === "draining" ? "Drain" : to === "maintenance" ? "Put into maintenance" : "Return to ready";
  const unhealthy = server.gpus.filter((g) => g.health !== "healthy" || !g.present);
  const mustConfirm = to === "ready" && unhealthy.length > 0;
  const affected = preview.data?.reservations ?? [];
  const windowHeader = `Window (${shownZone()})`;
  return (
    <Modal opened onClose={onClose} closeButtonProps={{ "aria-label": "Close" }} title={`${verb}: ${server.hostname}`} size="lg">
      <form onSubmit={(e) => { e.preventDefault(); change.mutate(); }}>
        <Stack>
          <Text size="sm" c="dimmed">
            {to === "draining" && "No new reservations are placed here. The reservations below keep their GPUs: running ones run to their end, booked ones still start here."}
            {to === "maintenance" && "The server takes no new work until it is returned to ready. The reservations below keep their GPUs."}
            {to === "ready" && "The server takes new reservations again."}
          </Text>
          {mustConfirm && (
            <Alert color="red" title="This server has unhealthy GPUs" data-testid="unhealthy-warning">
              <Stack gap={4}>
                <Text size="sm">
                  {unhealthy.length} GPU{unhealthy.length === 1 ? " is" : "s are"} unhealthy or missing. Reservations are
                  placed only on healthy GPUs, but tenants may be sent to a server with a fault you have not looked at.
                </Text>
                <List size="sm">
                  {unhealthy.map((g) => (
                    <List.Item key={g.uuid}>GPU {g.index}: {reasonList(g.health_reasons).map((r) => explainReason(r, g.telemetry?.[DCGM.temp])).join("; ") || (g.present ? g.health : "missing")}</List.Item>
                  ))}
                </List>
                <Checkbox label="Return it to ready anyway" checked={anyway} onChange={(e) => setAnyway(e.currentTarget.checked)} />
              </Stack>
            </Alert>
          )}
          {to !== "ready" && (
            <QueryState isLoading={preview.isLoading} error={preview.error} label="the reservations on this server">
              <div data-testid="drain-affected">
                <Text size="sm" fw={600}>
                  {affected.length === 0 ? "No reservation holds GPUs of this server now or later." : `Reservations affected (${affected.length}):`}
                </Text>
                {affected.length > 0 && (
                  <ResponsiveTable mt={4} withTableBorder aria-label="Reservations affected">
                    <Table.Thead>
                      <Table.Tr><Table.Th>Reservation</Table.Th><Table.Th>Tenant</Table.Th><Table.Th>GPUs</Table.Th><Table.Th>{windowHeader}</Table.Th></Table.Tr>
                    </Table.Thead>
                    <Table.Tbody>
                      {affected.map((r) => (
                        <Table.Tr key={r.reservation}>
                          <Table.Td data-label="Reservation">{r.name} <Text span size="xs" c="dimmed">{r.reservation.slice(0, 8)} · {r.running ? "running now" : "starts later"}</Text></Table.Td>
                          <Table.Td data-label="Tenant">{r.project}</Table.Td>
                          <Table.Td data-label="GPUs">{r.gpus.join(", ")}</Table.Td>
                          <Table.Td data-label={windowHeader}>{formatDateTime(r.starts_at)} – {formatDateTime(r.ends_at)}</Table.Td>
                        </Table.Tr>
                      ))}
                    </Table.Tbody>
                  </ResponsiveTable>
                )}
              </div>
            </QueryState>
          )}
          <TextInput label="Reason" required data-autofocus value={reason} onChange={(e) => setReason(e.currentTarget.value)}
            error={err?.fieldError("reason")} />
          {change.error && !err?.fieldError("reason") && <ErrorAlert error={change.error} title="The server refused" />}
          <Button type="submit" loading={change.isPending} disabled={mustConfirm && !anyway}>{verb}</Button>
        </Stack>
      </form>
    </Modal>
  );
}
