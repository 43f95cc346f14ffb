import { Anchor, Badge, Button, Card, Group, Select, Stack, Switch, Table, Text, Title } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";

import { api, isMissingEndpoint } from "../api/client";
import type { AppNotification, NotificationChannel, NotificationPreference, OutboxEmail, Page } from "../api/types";
import { portalPath } from "../components/NotificationBell";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatDateTime } from "../lib/format";

const CHANNELS = [
  { value: "email", label: "Email" },
  { value: "webhook", label: "Project webhooks only" },
  { value: "none", label: "Only this list" },
];

export function NotificationsPage() {
  return (
    <Stack>
      <Title order={1}>Notifications</Title>
      <NotificationList />
      <Preferences />
      <Outbox />
    </Stack>
  );
}

function NotificationList() {
  const queryClient = useQueryClient();
  const [unreadOnly, setUnreadOnly] = useState(false);
  const list = useQuery({
    queryKey: ["notifications", "list", unreadOnly],
    queryFn: () => api.get<Page<AppNotification>>("notifications/", { limit: 100, unread: unreadOnly ? "true" : undefined }),
  });
  const mark = useMutation({
    mutationFn: (ids?: number[]) => api.post("notifications/mark-read/", ids ? { ids } : {}),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["notifications"] }),
  });
  return (
    <Card withBorder>
      <Group justify="space-between" mb="sm">
        <Title order={2} size="h3">Your notifications</Title>
        <Group>
          <Switch label="Unread only" checked={unreadOnly} onChange={(e) => setUnreadOnly(e.currentTarget.checked)} />
          <Button size="xs" variant="light" onClick={() => mark.mutate(undefined)} loading={mark.isPending}>Mark all read</Button>
        </Group>
      </Group>
      <QueryState isLoading={list.isLoading} error={list.error} isEmpty={list.data?.results.length === 0}
        empty="No notifications." label="notifications">
        <ResponsiveTable minWidth={640} aria-label="Notifications">
          <Table.Thead>
            <Table.Tr><Table.Th>When</Table.Th><Table.Th>What</Table.Th><Table.Th>Project</Table.Th><Table.Th>Status</Table.Th></Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.results.map((n) => (
              <Table.Tr key={n.id} data-testid={`notification-${n.id}`}>
                <Table.Td data-label="When">{formatDateTime(n.occurred_at)}</Table.Td>
                <Table.Td data-label="What">
                  <Anchor component={Link} to={portalPath(n.link)} fw={n.unread ? 700 : 400}>{n.title}</Anchor>
                  <Text size="xs" c="dimmed" style={{ whiteSpace: "pre-line" }}>{n.body}</Text>
                </Table.Td>
                <Table.Td data-label="Project">{n.project ?? "fleet"}</Table.Td>
                <Table.Td data-label="Status">
                  {n.unread ? (
                    <Button size="compact-xs" variant="default" onClick={() => mark.mutate([n.id])} aria-label={`Mark read: ${n.title}`}>
                      Mark read
                    </Button>
                  ) : (
                    <Text size="xs" c="dimmed">read</Text>
                  )}
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
    </Card>
  );
}

function Preferences() {
  const queryClient = useQueryClient();
  const prefs = useQuery({
    queryKey: ["notification-preferences"],
    queryFn: () => api.get<{ preferences: NotificationPreference[] }>("notifications/preferences/"),
  });
  const save = useMutation({
    mutationFn: (p: { event_type: string; channel: NotificationChannel }) =>
      api.put<{ preferences: NotificationPreference[] }>("notifications/preferences/", { preferences: [p] }),
    onSuccess: (data) => queryClient.setQueryData(["notification-preferences"], data),
  });
  return (
    <Card withBorder aria-labelledby="prefs-title">
      <Title order={2} size="h3" id="prefs-title" mb="xs">Preferences</Title>
      <Text size="sm" c="dimmed" mb="sm">
        Every event is listed here and under the bell. Choose which also reach you by email.
      </Text>
      {save.error && <ErrorAlert error={save.error} title="Could not save" />}
      <QueryState isLoading={prefs.isLoading} error={prefs.error} label="preferences">
        <ResponsiveTable minWidth={480} aria-label="Notification preferences">
          <Table.Thead><Table.Tr><Table.Th>Event</Table.Th><Table.Th>How it reaches you</Table.Th></Table.Tr></Table.Thead>
          <Table.Tbody>
            {prefs.data?.preferences.map((p) => (
              <Table.Tr key={p.event_type}>
                <Table.Td data-label="Event">{p.description}</Table.Td>
                <Table.Td data-label="How it reaches you">
                  <Select aria-label={`Channel for ${p.description}`} data={CHANNELS} value={p.channel} allowDeselect={false}
                    onChange={(v) => v && save.mutate({ event_type: p.event_type, channel: v as NotificationChannel })}
                    data-testid={`pref-${p.event_type}`} />
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
    </Card>
  );
}

/** The demo's outbox: what the file backend wrote, so emails can be seen without a mail server. */
function Outbox() {
  const outbox = useQuery({
    queryKey: ["notifications", "outbox"],
    queryFn: () => api.get<Page<OutboxEmail>>("notifications/outbox/", { limit: 20 }),
    retry: false,
  });
  if (isMissingEndpoint(outbox.error)) return null; // real email: nothing kept to show
  return (
    <Card withBorder>
      <Title order={2} size="h3" mb="xs">Emails sent (demo outbox)</Title>
      <QueryState isLoading={outbox.isLoading} error={outbox.error} isEmpty={outbox.data?.results.length === 0}
        empty="No emails yet." label="emails">
        <Stack gap="xs">
          {outbox.data?.results.map((m) => (
            <details key={m.id} data-testid={`email-${m.id}`}>
              <summary>
                {m.subject} <Text span size="xs" c="dimmed">to {m.to_address}, {formatDateTime(m.created_at)}</Text>{" "}
                <Badge size="xs" variant="light" color={m.state === "sent" ? "green" : m.state === "failed" ? "red" : "gray"}>{m.state}</Badge>
              </summary>
              <Text size="sm" style={{ whiteSpace: "pre-wrap" }}>{m.body_text}</Text>
            </details>
          ))}
        </Stack>
      </QueryState>
    </Card>
  );
}
