// A running reservation's web apps and web terminal in the browser, through the control plane's authenticated
// proxy (docs/proxy.md, "Opening an app"). Open asks for a one-time signed link (reservations/{id}/open/) and sends a
// new tab to it; the proxy signs that tab in to the app's host and redirects to the app.
import { Anchor, Badge, Button, Card, Code, Group, NativeSelect, Stack, Table, Text } from "@mantine/core";
import { useCallback, useEffect, useRef, useState } from "react";

import { api } from "../api/client";
import type { OpenedApp, ReservationDetail, TerminalTicket } from "../api/types";
import { forwardCommand, webAppLines, type WebAppLine } from "../lib/ports";
import { FINAL_STATES } from "../lib/reservation";
import { canReconnect, closeText, type TerminalStatus } from "../lib/terminal";
import type { TerminalView } from "./terminalView";
import { ErrorAlert } from "./QueryState";
import { ResponsiveTable } from "./ResponsiveTable";

/** A tab opened on the click itself (a popup blocker lets that through), pointed at the link once it comes. */
function blankTab(title: string): Window | null {
  const tab = window.open("", "_blank");
  if (!tab) return null;
  // The app must not reach back into the portal (reverse tabnabbing): the tab forgets who opened it.
  tab.opener = null;
  try {
    tab.document.title = title;
    tab.document.body.textContent = title;
  } catch {
    // Nothing to say in a tab that is not ours to write.
  }
  return tab;
}

export function WebAppsPanel({ r, terminalOpen, onTerminal }: {
  r: ReservationDetail;
  terminalOpen: boolean;
  onTerminal: () => void;
}) {
  const access = r.access;
  const lines = webAppLines(r.ports, access?.web);
  const [opening, setOpening] = useState<string | null>(null);
  const [error, setError] = useState<{ name: string; error: unknown } | null>(null);
  // A popup blocker that ate even the click's own tab: the link, to click within its minute.
  const [blocked, setBlocked] = useState<{ name: string; url: string } | null>(null);
  if (!access || (lines.length === 0 && !access.terminal)) return null;

  async function open(line: WebAppLine) {
    const name = line.port.name;
    setError(null);
    setBlocked(null);
    setOpening(name);
    const tab = blankTab(`Opening ${line.jupyter ? "JupyterLab" : name}…`);
    try {
      const answer = await api.post<OpenedApp>(`reservations/${r.id}/open/`, { port: name });
      if (tab && !tab.closed) tab.location.href = answer.url;
      else setBlocked({ name, url: answer.url });
    } catch (e) {
      tab?.close();
      setError({ name, error: e });
    } finally {
      setOpening(null);
    }
  }

  return (
    <Card withBorder aria-labelledby="web-apps-title" data-testid="web-apps">
      <Group justify="space-between" mb="xs">
        <Text fw={600} id="web-apps-title">
          Web apps
        </Text>
        {access.terminal && (
          <Button size="xs" variant={terminalOpen ? "filled" : "default"} aria-pressed={terminalOpen} onClick={onTerminal}
            data-testid="terminal-button">
            Terminal
          </Button>
        )}
      </Group>
      <Stack gap="xs">
        {!access.ready && (
          <Text size="sm" c="dimmed" data-testid="web-apps-message">
            {access.message}
          </Text>
        )}
        {lines.length === 0 ? (
          <Text size="sm" c="dimmed">
            This reservation declares no web ports; a booking names them under Web ports.
          </Text>
        ) : (
          <ResponsiveTable minWidth={480} aria-label="Web apps">
            <Table.Thead>
              <Table.Tr>
                <Table.Th>Name</Table.Th>
                <Table.Th>Port</Table.Th>
                <Table.Th>Protocol</Table.Th>
                <Table.Th>Open</Table.Th>
              </Table.Tr>
            </Table.Thead>
            <Table.Tbody>
              {lines.map((line) => (
                <Table.Tr key={line.port.name} data-testid={`web-app-${line.port.name}`}>
                  <Table.Td data-label="Name">{line.port.name}</Table.Td>
                  <Table.Td data-label="Port">{line.port.port}</Table.Td>
                  <Table.Td data-label="Protocol">
                    <Badge variant="light" color={line.port.protocol === "http" ? "blue" : "gray"}>{line.port.protocol}</Badge>
                  </Table.Td>
                  <Table.Td data-label="Open">
                    <OpenCell r={r} line={line} opening={opening === line.port.name} onOpen={() => open(line)} />
                  </Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </ResponsiveTable>
        )}
        {blocked && (
          <Text size="sm" data-testid="web-app-link">
            The browser blocked the new tab:{" "}
            <Anchor href={blocked.url} target="_blank" rel="noopener noreferrer">
              open {blocked.name}
            </Anchor>{" "}
            (the link works once, within a minute).
          </Text>
        )}
        {error && <ErrorAlert error={error.error} title={`Could not open ${error.name}`} />}
      </Stack>
    </Card>
  );
}

function OpenCell({ r, line, opening, onOpen }: { r: ReservationDetail; line: WebAppLine; opening: boolean; onOpen: () => void }) {
  const p = line.port;
  if (p.protocol !== "http") {
    return (
      <Text size="xs">
        Not in the browser; reach it with <Code>{forwardCommand(r.id, p.port)}</Code>
      </Text>
    );
  }
  if (!line.app) {
    const over = r.state === "ending" || FINAL_STATES.includes(r.state);
    return (
      <Text size="xs" c="dimmed">
        {over
          ? "Closed with the reservation."
          : r.access.ready
            ? "Not served by the proxy now."
            : "Opens once the container runs."}
      </Text>
    );
  }
  return (
    <Group gap="xs" wrap="nowrap">
      <Button
        size="xs"
        variant={line.jupyter ? "filled" : "light"}
        loading={opening}
        onClick={onOpen}
        aria-label={line.jupyter ? undefined : `Open ${p.name}`}
        className="rt-keep"
      >
        {line.jupyter ? "Open JupyterLab" : "Open"}
      </Button>
      <Text size="xs" c="dimmed" ff="monospace" style={{ overflowWrap: "anywhere" }} visibleFrom="sm">
        {line.app.url}
      </Text>
    </Group>
  );
}

/** The web terminal's card: its status line, Reconnect and (on several servers) the server. The terminal itself
 * (xterm, about 70 kB compressed) is a chunk of its own, imported when the card opens. */
export function TerminalPanel({ r, onClose }: { r: ReservationDetail; onClose: () => void }) {
  // A reservation on several servers has a shell on each: the first is opened unless another is picked.
  const held = r.allocations.filter((a) => a.active).map((a) => a.server);
  const servers = Array.from(new Set([...(r.access?.ssh ?? []).map((s) => s.server), ...held]));
  const [server, setServer] = useState<string | null>(servers.length > 1 ? servers[0] : null);
  const [attempt, setAttempt] = useState(0);
  const [status, setStatus] = useState<TerminalStatus>({ kind: "connecting" });
  const holder = useRef<HTMLDivElement>(null);
  const [view, setView] = useState<TerminalView | null>(null);
  // A new function per server and per attempt (Reconnect): the terminal connects again with each.
  const ticket = useCallback(
    () => api.post<TerminalTicket>(`reservations/${r.id}/terminal/`, server ? { server } : {}),
    [r.id, server, attempt],
  );
  useEffect(() => {
    let gone = false;
    let mounted: TerminalView | null = null;
    import("./terminalView").then(
      (m) => {
        if (gone || !holder.current) return;
        // In sight: it is what was asked for, and xterm draws nothing while off screen.
        holder.current.scrollIntoView({ block: "nearest" });
        mounted = m.mountTerminal(holder.current, setStatus);
        setView(mounted);
      },
      (error: unknown) => !gone && setStatus({ kind: "refused", error }),
    );
    return () => {
      gone = true;
      mounted?.dispose();
      setView(null);
    };
  }, []);
  useEffect(() => view?.connect(ticket), [view, ticket]);
  const again = status.kind === "refused" || (status.kind === "closed" && canReconnect(status.code));
  return (
    <Card withBorder aria-labelledby="terminal-title" data-testid="terminal-panel">
      <Group justify="space-between" mb="xs">
        <Text fw={600} id="terminal-title">
          Terminal
        </Text>
        <Group gap="xs">
          {servers.length > 1 && (
            <NativeSelect size="xs" aria-label="Server" data={servers} value={server ?? undefined}
              onChange={(e) => setServer(e.currentTarget.value)} />
          )}
          <Button size="xs" variant="default" onClick={onClose}>
            Close terminal
          </Button>
        </Group>
      </Group>
      <div
        ref={holder}
        role="group"
        aria-label="Terminal"
        aria-describedby="terminal-status"
        data-testid="web-terminal"
        style={{ height: 420, padding: 6, background: "#000", borderRadius: 4 }}
      />
      <Group gap="sm" mt="xs" justify="space-between" wrap="wrap">
        <Text size="sm" id="terminal-status" role="status" data-testid="terminal-status" data-state={status.kind}
          data-code={status.kind === "closed" ? status.code : undefined}>
          {statusText(status)}
        </Text>
        {again && (
          <Button size="xs" variant="light" onClick={() => setAttempt((n) => n + 1)}>
            Reconnect
          </Button>
        )}
      </Group>
      {status.kind === "refused" && <ErrorAlert error={status.error} title="Could not open a terminal" />}
    </Card>
  );
}

function statusText(status: TerminalStatus): string {
  switch (status.kind) {
    case "connecting":
      return "Connecting…";
    case "open":
      return `Connected to a shell in the container${status.server ? ` on ${status.server}` : ""}.`;
    case "closed":
      return closeText(status.code, status.reason);
    case "refused":
      return "The terminal could not be opened.";
  }
}
