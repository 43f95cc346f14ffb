import { Alert, Badge, Button, Card, Code, CopyButton, Group, MultiSelect, Stack, Table, Text, TextInput, Title } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";

import { ApiError, api } from "../api/client";
import { useMe } from "../api/hooks";
import type { Page, WebhookDelivery, WebhookEndpoint } from "../api/types";
import { ConfirmButton } from "../components/ConfirmButton";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatDateTime } from "../lib/format";
import { ProjectPicker, useProjectChoices } from "../components/ProjectPicker";

const EVENTS = [
  "reservation.booked", "reservation.starting", "reservation.running", "reservation.ends_soon", "reservation.extended",
  "reservation.failed", "reservation.interrupted", "reservation.requeued", "reservation.preempted",
  "reservation.gpu_fault", "reservation.image_failed", "reservation.idle_warning", "project.budget_threshold",
];

/** A project's webhook endpoints, for its owners (and operators): add, test, rotate, and the delivery log. */
export function WebhooksPage() {
  const me = useMe().data;
  const { choices } = useProjectChoices();
  const owned = me?.is_operator ? choices : choices.filter((c) => me?.memberships.some((m) => m.project_slug === c.value && m.role === "owner"));
  const [slug, setSlug] = useState<string | null>(null);
  const chosen = slug ?? owned[0]?.value ?? null;
  const projectId = me?.memberships.find((m) => m.project_slug === chosen)?.project_id;
  const projects = useQuery({
    queryKey: ["projects", "ids"],
    enabled: !!me?.is_operator,
    queryFn: async () => (await api.get<Page<{ id: number; slug: string }>>("projects/", { limit: 500 })).results,
  });
  const id = projectId ?? projects.data?.find((p) => p.slug === chosen)?.id;
  return (
    <Stack>
      <Title order={1}>Webhooks</Title>
      <Text size="sm" c="dimmed">
        Events of a project POSTed to your URL, signed per the Standard Webhooks specification
        (<Code>webhook-id</Code>, <Code>webhook-timestamp</Code>, <Code>webhook-signature</Code>). Owners manage them.
      </Text>
      {owned.length === 0 ? (
        <Alert color="gray" title="No project of yours">Only a project's owners manage its webhooks.</Alert>
      ) : (
        <>
          <ProjectPicker value={chosen} onChange={setSlug} choices={owned} />
          {id !== undefined && <Endpoints projectId={id} />}
        </>
      )}
    </Stack>
  );
}

function Endpoints({ projectId }: { projectId: number }) {
  const queryClient = useQueryClient();
  const base = `projects/${projectId}/webhooks/`;
  const list = useQuery({ queryKey: ["webhooks", projectId], queryFn: () => api.get<Page<WebhookEndpoint>>(base, { limit: 100 }) });
  const [url, setUrl] = useState("");
  const [events, setEvents] = useState<string[]>(["reservation.running", "reservation.failed"]);
  const create = useMutation({
    mutationFn: () => api.post<WebhookEndpoint>(base, { url, events }),
    onSuccess: () => {
      setUrl("");
      queryClient.invalidateQueries({ queryKey: ["webhooks", projectId] });
    },
  });
  const err = create.error instanceof ApiError ? create.error : null;
  function submit(e: FormEvent) {
    e.preventDefault();
    create.mutate();
  }
  return (
    <Stack>
      <Card withBorder component="form" onSubmit={submit} aria-label="New webhook endpoint">
        <Group align="flex-end">
          <TextInput label="URL" required value={url} onChange={(e) => setUrl(e.currentTarget.value)} error={err?.fieldError("url")}
            placeholder="https://example.org/hooks/gpu" style={{ flex: 1, minWidth: 240 }} />
          <MultiSelect label="Events" data={EVENTS} value={events} onChange={setEvents} error={err?.fieldError("events")}
            style={{ flex: 1, minWidth: 240 }} searchable />
          <Button type="submit" loading={create.isPending}>Add endpoint</Button>
        </Group>
        {create.error && !err?.fieldError("url") && !err?.fieldError("events") && <ErrorAlert error={create.error} />}
      </Card>
      <QueryState isLoading={list.isLoading} error={list.error} isEmpty={list.data?.results.length === 0}
        empty="No webhook endpoints." label="webhook endpoints">
        {list.data?.results.map((e) => <Endpoint key={e.id} endpoint={e} base={base} projectId={projectId} />)}
      </QueryState>
    </Stack>
  );
}

function Endpoint({ endpoint, base, projectId }: { endpoint: WebhookEndpoint; base: string; projectId: number }) {
  const queryClient = useQueryClient();
  const path = `${base}${endpoint.id}/`;
  const refresh = () => {
    queryClient.invalidateQueries({ queryKey: ["webhooks", projectId] });
    queryClient.invalidateQueries({ queryKey: ["deliveries", endpoint.id] });
  };
  const deliveries = useQuery({
    queryKey: ["deliveries", endpoint.id],
    queryFn: () => api.get<Page<WebhookDelivery>>(`${path}deliveries/`, { limit: 20 }),
    refetchInterval: 5000,
  });
  const test = useMutation({ mutationFn: () => api.post(`${path}test/`), onSuccess: refresh });
  const rotate = useMutation({ mutationFn: () => api.post(`${path}rotate-secret/`, {}), onSuccess: refresh });
  const toggle = useMutation({ mutationFn: () => api.patch(path, { enabled: !endpoint.enabled }), onSuccess: refresh });
  const remove = useMutation({ mutationFn: () => api.del(path), onSuccess: refresh });
  const failure = test.error ?? rotate.error ?? toggle.error;
  return (
    <Card withBorder data-testid={`webhook-${endpoint.id}`} aria-label={`Webhook ${endpoint.url}`} component="section">
      <Group justify="space-between" wrap="wrap">
        <Stack gap={2}>
          <Text fw={600} style={{ wordBreak: "break-all" }}>{endpoint.url}</Text>
          <Text size="xs" c="dimmed">{endpoint.events.join(", ")}</Text>
        </Stack>
        <Badge color={endpoint.enabled ? "green" : "red"} variant="light">{endpoint.enabled ? "enabled" : "disabled"}</Badge>
      </Group>
      {!endpoint.enabled && endpoint.disabled_reason && <Text size="sm" c="red.8" mt="xs">{endpoint.disabled_reason}</Text>}
      <Group mt="xs" wrap="nowrap" align="flex-start">
        <Text size="sm">Secret:</Text>
        <Code style={{ wordBreak: "break-all", minWidth: 0 }}>{endpoint.secret}</Code>
        <CopyButton value={endpoint.secret}>
          {({ copied, copy }) => (
            <Button size="compact-xs" variant="light" onClick={copy} aria-label="Copy the secret">{copied ? "Copied" : "Copy"}</Button>
          )}
        </CopyButton>
      </Group>
      {endpoint.previous_secret_expires_at && (
        <Text size="xs" c="dimmed">The previous secret also signs until {formatDateTime(endpoint.previous_secret_expires_at)}.</Text>
      )}
      <Group mt="sm">
        <Button size="xs" onClick={() => test.mutate()} loading={test.isPending} disabled={!endpoint.enabled}>Send test event</Button>
        <ConfirmButton size="xs" variant="default" color="gray" title="Rotate the secret?" confirmLabel="Rotate" keepLabel="Keep it" errorTitle="Could not rotate"
          message="A new secret signs from now on; the current one keeps signing beside it for 24 hours, so your receiver can switch."
          onConfirm={() => rotate.mutateAsync()}>
          Rotate secret
        </ConfirmButton>
        <Button size="xs" variant="default" onClick={() => toggle.mutate()} loading={toggle.isPending}>
          {endpoint.enabled ? "Disable" : "Enable"}
        </Button>
        <ConfirmButton size="xs" color="red" variant="light" title="Delete this endpoint?" confirmLabel="Delete" keepLabel="Keep it"
          errorTitle="Could not delete" message="Its delivery log goes with it." onConfirm={() => remove.mutateAsync()}>
          Delete
        </ConfirmButton>
      </Group>
      {failure && <ErrorAlert error={failure} />}
      <Title order={3} size="h5" mt="md" mb="xs">Delivery log</Title>
      <QueryState isLoading={deliveries.isLoading} error={deliveries.error} isEmpty={deliveries.data?.results.length === 0}
        empty="Nothing delivered yet." label="deliveries">
        <ResponsiveTable minWidth={640} aria-label={`Deliveries to ${endpoint.url}`}>
          <Table.Thead>
            <Table.Tr><Table.Th>Event</Table.Th><Table.Th>State</Table.Th><Table.Th>Attempts</Table.Th><Table.Th>Last answer</Table.Th><Table.Th>Next attempt</Table.Th></Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {deliveries.data?.results.map((d) => (
              <Table.Tr key={d.id} data-testid={`delivery-${d.id}`}>
                <Table.Td data-label="Event">{d.type}<Text size="xs" c="dimmed">{formatDateTime(d.created_at)}</Text></Table.Td>
                <Table.Td data-label="State">{d.state}</Table.Td>
                <Table.Td data-label="Attempts">{d.attempts}</Table.Td>
                <Table.Td data-label="Last answer">
                  {d.last_status_code ?? (d.last_error || "—")}
                  {d.last_response && <Text size="xs" c="dimmed" lineClamp={2}>{d.last_response}</Text>}
                </Table.Td>
                <Table.Td data-label="Next attempt">{d.next_attempt_at ? formatDateTime(d.next_attempt_at) : "—"}</Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
    </Card>
  );
}
