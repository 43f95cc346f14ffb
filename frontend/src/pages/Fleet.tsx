import { Badge, Button, Card, Group, Modal, SegmentedControl, SimpleGrid, Stack, Table, Text, TextInput, Title, Tooltip } from "@mantine/core";
import { useMutation, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";

import { ApiError, api } from "../api/client";
import { useServers } from "../api/hooks";
import { DCGM, type Server, type ServerGpu, type ServerState } from "../api/types";
import { SimulatedBadge, StateBadge } from "../components/Badges";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { formatRelative, heatColor } from "../lib/format";

type Metric = "util" | "temp";

export function FleetPage() {
  const servers = useServers(5_000);
  const [metric, setMetric] = useState<Metric>("util");
  const [acting, setActing] = useState<{ server: Server; to: ServerState } | null>(null);
  const list = servers.data ?? [];
  const gpus = list.flatMap((s) => s.gpus);
  const unhealthy = list.flatMap((s) => s.gpus.filter((g) => g.health !== "healthy" || !g.present).map((g) => ({ s, g })));

  return (
    <Stack>
      <Title order={2}>Fleet health</Title>
      <QueryState isLoading={servers.isLoading} error={servers.error} isEmpty={list.length === 0}
        empty="No servers are enrolled. Create a join token and start an agent." label="servers">
        <SimpleGrid cols={{ base: 2, sm: 4 }}>
          <Stat label="Servers" value={list.length} />
          <Stat label="Ready" value={list.filter((s) => s.state === "ready").length} />
          <Stat label="GPUs" value={gpus.length} />
          <Stat label="Unhealthy GPUs" value={unhealthy.length} color={unhealthy.length ? "red" : undefined} />
        </SimpleGrid>

        <Card withBorder>
          <Group justify="space-between" mb="xs">
            <Text fw={600}>GPU heatmap</Text>
            <SegmentedControl size="xs" value={metric} onChange={(v) => setMetric(v as Metric)} aria-label="Heatmap metric"
              data={[{ value: "util", label: "Utilization" }, { value: "temp", label: "Temperature" }]} />
          </Group>
          <Stack gap="sm" data-testid="heatmap">
            {list.map((s) => (
              <div key={s.id}>
                <Group gap="xs" mb={4}>
                  <Text size="sm" fw={500}>{s.hostname}</Text>
                  {s.simulated && <SimulatedBadge />}
                </Group>
                <div className="heat-grid">
                  {s.gpus.map((g) => <HeatCell key={g.uuid} gpu={g} metric={metric} />)}
                </div>
              </div>
            ))}
          </Stack>
        </Card>

        <Card withBorder>
          <Text fw={600} mb="xs">Servers</Text>
          <Table.ScrollContainer minWidth={720}>
            <Table striped>
              <Table.Thead>
                <Table.Tr>
                  <Table.Th>Host</Table.Th><Table.Th>State</Table.Th><Table.Th>GPUs</Table.Th>
                  <Table.Th>Last heartbeat</Table.Th><Table.Th>Agent</Table.Th><Table.Th>Actions</Table.Th>
                </Table.Tr>
              </Table.Thead>
              <Table.Tbody>
                {list.map((s) => (
                  <Table.Tr key={s.id} data-testid={`server-${s.hostname}`}>
                    <Table.Td>
                      <Group gap={4}>{s.hostname} {s.simulated && <SimulatedBadge />}</Group>
                    </Table.Td>
                    <Table.Td><StateBadge state={s.state} /></Table.Td>
                    <Table.Td>
                      {s.gpus.length} × {s.gpus[0]?.model ?? "?"}
                      {s.gpus.some((g) => g.health !== "healthy") && <Badge color="red" ml={4} size="xs">unhealthy</Badge>}
                    </Table.Td>
                    <Table.Td>{s.last_heartbeat_at ? formatRelative(s.last_heartbeat_at) : "never"}</Table.Td>
                    <Table.Td>{s.agent_version || "–"}</Table.Td>
                    <Table.Td>
                      <Group gap={4} wrap="nowrap">
                        {s.state === "ready" && <Button size="xs" variant="light" color="yellow" onClick={() => setActing({ server: s, to: "draining" })}>Drain</Button>}
                        {s.state !== "maintenance" && s.state !== "retired" && <Button size="xs" variant="light" color="orange" onClick={() => setActing({ server: s, to: "maintenance" })}>Maintenance</Button>}
                        {["draining", "maintenance", "commissioning"].includes(s.state) && <Button size="xs" variant="light" color="green" onClick={() => setActing({ server: s, to: "ready" })}>Return to ready</Button>}
                      </Group>
                    </Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
            </Table>
          </Table.ScrollContainer>
        </Card>

        <Card withBorder>
          <Text fw={600} mb="xs">Health</Text>
          {unhealthy.length === 0 ? (
            <Text size="sm" c="dimmed">Every GPU is healthy and present.</Text>
          ) : (
            <Stack gap={4}>
              {unhealthy.map(({ s, g }) => (
                <Text size="sm" key={g.uuid}>
                  <b>{s.hostname} GPU {g.index}</b>: {g.present ? g.health : "missing"} — {reasonsText(g.health_reasons)}
                  {g.needs_acknowledgement && " (needs acknowledgement)"}
                </Text>
              ))}
            </Stack>
          )}
        </Card>
      </QueryState>
      {acting && <StateChange server={acting.server} to={acting.to} onClose={() => setActing(null)} />}
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

export function reasonsText(reasons: unknown): string {
  if (!reasons) return "no reason recorded";
  if (Array.isArray(reasons)) {
    return reasons.map((r) => (typeof r === "string" ? r : r && typeof r === "object" && "message" in r ? String((r as { message: unknown }).message) : JSON.stringify(r))).join("; ") || "no reason recorded";
  }
  return typeof reasons === "string" ? reasons : JSON.stringify(reasons);
}

function HeatCell({ gpu, metric }: { gpu: ServerGpu; metric: Metric }) {
  const t = gpu.telemetry ?? {};
  const util = t[DCGM.util];
  const temp = t[DCGM.temp];
  const value = metric === "util" ? util : temp;
  const bg = !gpu.present ? "var(--mantine-color-dark-3)" : metric === "util" ? heatColor(util, 100) : heatColor(temp == null ? null : temp - 30, 60);
  return (
    <Tooltip label={`GPU ${gpu.index} · ${gpu.health}${gpu.present ? "" : " · missing"} · util ${util ?? "–"}% · ${temp ?? "–"} °C`}>
      <div className="heat-cell" style={{ background: bg, outline: gpu.health !== "healthy" ? "3px solid var(--mantine-color-red-8)" : undefined }}
        tabIndex={0} aria-label={`GPU ${gpu.index}: ${metric === "util" ? `utilization ${util ?? "unknown"}%` : `temperature ${temp ?? "unknown"} °C`}`}>
        <span>{gpu.index}</span>
        <span>{value == null ? "–" : `${Math.round(value)}${metric === "util" ? "%" : "°"}`}</span>
      </div>
    </Tooltip>
  );
}

function StateChange({ server, to, onClose }: { server: Server; to: ServerState; onClose: () => void }) {
  const [reason, setReason] = useState("");
  const queryClient = useQueryClient();
  const change = useMutation({
    mutationFn: () => api.post<Server>(`servers/${server.id}/state/`, { state: to, reason }),
    onSuccess: () => {
      queryClient.invalidateQueries({ queryKey: ["servers"] });
      onClose();
    },
  });
  const err = change.error instanceof ApiError ? change.error : null;
  const verb = to === "draining" ? "Drain" : to === "maintenance" ? "Put into maintenance" : "Return to ready";
  return (
    <Modal opened onClose={onClose} title={`${verb}: ${server.hostname}`}>
      <form onSubmit={(e) => { e.preventDefault(); change.mutate(); }}>
        <Stack>
          <Text size="sm" c="dimmed">
            {to === "draining" && "Running reservations finish; no new ones are placed here."}
            {to === "maintenance" && "The server takes no work until it is returned to ready."}
            {to === "ready" && "The server takes new reservations again."}
          </Text>
          <TextInput label="Reason" required data-autofocus value={reason} onChange={(e) => setReason(e.currentTarget.value)}
            error={err?.fieldError("reason")} />
          {change.error && !err?.fieldError("reason") && <ErrorAlert error={change.error} title="The server refused" />}
          <Button type="submit" loading={change.isPending}>{verb}</Button>
        </Stack>
      </form>
    </Modal>
  );
}
