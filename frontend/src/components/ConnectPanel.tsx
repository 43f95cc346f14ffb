import { Alert, Button, Card, Code, CopyButton, Group, Stack, Text } from "@mantine/core";

import type { ReservationAccess } from "../api/types";

/** How to get into a running reservation: per server, the ssh command and the gateway's known_hosts line,
 * each with a copy button, so nobody has to trust a host key on first use. */
export function ConnectPanel({ access, reservationId }: { access: ReservationAccess | undefined; reservationId: string }) {
  if (!access) return null;
  return (
    <Card withBorder aria-labelledby="connect-title" data-testid="connect-panel" data-ready={access.ready ? "yes" : "no"}>
      <Text fw={600} mb="xs" id="connect-title">
        Connect
      </Text>
      {!access.ready ? (
        <Text size="sm" c="dimmed">
          {access.message}
        </Text>
      ) : (
        <Stack gap="sm">
          {access.ssh.map((entry) => (
            <Stack key={entry.server} gap={4}>
              {access.ssh.length > 1 && (
                <Text size="sm" fw={500}>
                  {entry.server}
                </Text>
              )}
              <CopyLine label="SSH command" value={entry.command} />
              <CopyLine label="known_hosts line" value={entry.known_hosts} />
            </Stack>
          ))}
          <Alert variant="light" p="xs">
            <Text size="xs">
              Add the known_hosts line to <Code>~/.ssh/known_hosts</Code> first, or let{" "}
              <Code>gpucp ssh {reservationId}</Code> do both. Forward a port with{" "}
              <Code>-L 8888:localhost:8888</Code> for Jupyter; copy files with <Code>scp -P {access.ssh[0]?.port}</Code>.
            </Text>
          </Alert>
        </Stack>
      )}
    </Card>
  );
}

function CopyLine({ label, value }: { label: string; value: string }) {
  return (
    <Group gap="xs" wrap="nowrap" align="center">
      <Text size="xs" c="dimmed" w={110} style={{ flexShrink: 0 }}>
        {label}
      </Text>
      <Code style={{ overflowX: "auto", whiteSpace: "nowrap", flex: 1, minWidth: 0 }} aria-label={label} tabIndex={0}>
        {value}
      </Code>
      <CopyButton value={value}>
        {({ copied, copy }) => (
          <Button size="xs" variant="light" onClick={copy} aria-label={`Copy the ${label}`} className="rt-keep">
            {copied ? "Copied" : "Copy"}
          </Button>
        )}
      </CopyButton>
    </Group>
  );
}
