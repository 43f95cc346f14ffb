import { ActionIcon, Anchor, Button, Group, Indicator, Popover, ScrollArea, Stack, Text, VisuallyHidden } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router";

import { api } from "../api/client";
import { pollUnlessRefused } from "../api/hooks";
import type { AppNotification, Page } from "../api/types";
import { formatDateTime } from "../lib/format";

/** A path inside the portal from a notification's absolute link, so a click stays in the app. */
export function portalPath(link: string): string {
  try {
    const url = new URL(link);
    return url.pathname + url.search;
  } catch {
    return "/notifications";
  }
}

/** The bell in the header: the unread count, polled, and the latest notifications in a popover. */
export function NotificationBell() {
  const queryClient = useQueryClient();
  const [opened, setOpened] = useState(false);
  const count = useQuery({
    queryKey: ["notifications", "unread"],
    queryFn: () => api.get<{ unread: number }>("notifications/unread-count/"),
    refetchInterval: pollUnlessRefused(30_000),
  });
  const latest = useQuery({
    queryKey: ["notifications", "latest"],
    queryFn: () => api.get<Page<AppNotification>>("notifications/", { limit: 10 }),
    enabled: opened,
  });
  const markAll = useMutation({
    mutationFn: () => api.post<{ marked: number; unread: number }>("notifications/mark-read/", {}),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["notifications"] }),
  });
  const unread = count.data?.unread ?? 0;
  const label = unread ? `Notifications, ${unread} unread` : "Notifications";
  return (
    // The Indicator wraps the popover, not its target: the target's own element gets the popover's ARIA
    // attributes (aria-expanded), which a plain div may not carry.
    <Indicator label={unread > 99 ? "99+" : unread} size={16} disabled={!unread} color="red" offset={4}>
    <Popover opened={opened} onChange={setOpened} position="bottom-end" width={360} shadow="md" withinPortal>
      <Popover.Target>
          <ActionIcon variant="default" size="lg" aria-label={label} data-testid="notification-bell"
            onClick={() => setOpened((o) => !o)}>
            <svg width="18" height="18" viewBox="0 0 24 24" fill="none" stroke="currentColor" strokeWidth="2"
              strokeLinecap="round" strokeLinejoin="round" aria-hidden="true">
              <path d="M18 8a6 6 0 0 0-12 0c0 7-3 9-3 9h18s-3-2-3-9" />
              <path d="M13.7 21a2 2 0 0 1-3.4 0" />
            </svg>
          </ActionIcon>
      </Popover.Target>
      <Popover.Dropdown>
        <Group justify="space-between" mb="xs">
          <Text fw={600}>Notifications</Text>
          <Button size="compact-xs" variant="subtle" onClick={() => markAll.mutate()} disabled={!unread} loading={markAll.isPending}>
            Mark all read
          </Button>
        </Group>
        <ScrollArea.Autosize mah={360}>
          <Stack gap="xs" data-testid="notification-list">
            {latest.isLoading && <Text size="sm" c="dimmed">Loading…</Text>}
            {latest.data?.results.length === 0 && <Text size="sm" c="dimmed">Nothing yet.</Text>}
            {latest.data?.results.map((n) => (
              <Anchor key={n.id} component={Link} to={portalPath(n.link)} onClick={() => setOpened(false)} underline="never" c="inherit">
                <Text size="sm" fw={n.unread ? 700 : 400}>
                  {n.unread && <VisuallyHidden>Unread: </VisuallyHidden>}
                  {n.title}
                </Text>
                <Text size="xs" c="dimmed">{formatDateTime(n.occurred_at)}</Text>
              </Anchor>
            ))}
          </Stack>
        </ScrollArea.Autosize>
        <Anchor component={Link} to="/notifications" size="sm" mt="xs" display="block" onClick={() => setOpened(false)}>
          All notifications and preferences
        </Anchor>
      </Popover.Dropdown>
    </Popover>
    </Indicator>
  );
}
