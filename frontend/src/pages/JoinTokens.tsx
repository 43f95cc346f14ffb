import { Alert, Button, Card, Code, CopyButton, Group, NumberInput, Stack, Table, Text, TextInput, Title, VisuallyHidden } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";

import { ApiError, api } from "../api/client";
import type { JoinToken, JoinTokenIssued, Page } from "../api/types";
import { StateBadge } from "../components/Badges";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatDateTime } from "../lib/format";
import { shownZone } from "../lib/report";

/** The whole command a new server runs to enroll: what the Copy button copies. */
export function agentCommand(token: string, origin: string = window.location.origin): string {
  return `python -m nodeagent run --server ${origin} --join-token ${token}`;
}

export function JoinTokensPage() {
  const queryClient = useQueryClient();
  const tokens = useQuery({ queryKey: ["join-tokens"], queryFn: () => api.get<Page<JoinToken>>("join-tokens/", { limit: 200 }) });
  const [note, setNote] = useState("");
  const [ttlHours, setTtlHours] = useState<number>(24);
  const [issued, setIssued] = useState<JoinTokenIssued | null>(null);
  const create = useMutation({
    mutationFn: () => api.post<JoinTokenIssued>("join-tokens/", { note, ttl_s: Math.round(ttlHours * 3600) }),
    onSuccess: (t) => {
      setIssued(t);
      setNote("");
      queryClient.invalidateQueries({ queryKey: ["join-tokens"] });
    },
  });
  const revoke = useMutation({
    mutationFn: (id: number) => api.post<JoinToken>(`join-tokens/${id}/revoke/`),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["join-tokens"] }),
  });
  const err = create.error instanceof ApiError ? create.error : null;
  const expires = `Expires (${shownZone()})`;

  function submit(e: FormEvent) {
    e.preventDefault();
    create.mutate();
  }

  return (
    <Stack>
      <Title order={1}>Join tokens</Title>
      <Text size="sm" c="dimmed">A join token lets one new server enroll its agent once; it then gets its own credential.</Text>
      <Card withBorder component="form" onSubmit={submit} aria-label="New join token">
        <Group align="flex-end">
          <TextInput label="Note" placeholder="rack 4, slot 12" value={note} onChange={(e) => setNote(e.currentTarget.value)} error={err?.fieldError("note")} />
          <NumberInput label="Valid for (hours)" min={0.1} max={720} value={ttlHours}
            onChange={(v) => setTtlHours(typeof v === "number" ? v : Number(v) || 0)} error={err?.fieldError("ttl_s")} />
          <Button type="submit" loading={create.isPending}>Create join token</Button>
        </Group>
        {create.error && !err?.fieldError("note") && !err?.fieldError("ttl_s") && <ErrorAlert error={create.error} />}
      </Card>
      {issued && (
        <Alert color="green" title="Join token created" withCloseButton closeButtonLabel="Dismiss the join token" onClose={() => setIssued(null)}>
          <Text size="sm">Shown only once. On the new server run:</Text>
          <Code block mt="xs" style={{ whiteSpace: "pre-wrap", wordBreak: "break-all" }} data-testid="agent-command">
            {agentCommand(issued.token)}
          </Code>
          <CopyButton value={agentCommand(issued.token)}>
            {({ copied, copy }) => (
              <Button size="xs" mt="xs" variant="light" onClick={copy} className="rt-keep" data-copy-value={agentCommand(issued.token)}>
                {copied ? "Copied the command" : "Copy command"}
              </Button>
            )}
          </CopyButton>
        </Alert>
      )}
      <QueryState isLoading={tokens.isLoading} error={tokens.error} isEmpty={tokens.data?.results.length === 0}
        empty="No join tokens yet." label="join tokens">
        <ResponsiveTable minWidth={640} striped aria-label="Join tokens" data-testid="join-tokens">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Lookup</Table.Th><Table.Th>Note</Table.Th><Table.Th>Status</Table.Th><Table.Th>By</Table.Th>
              <Table.Th>{expires}</Table.Th><Table.Th>Server</Table.Th><Table.Th><VisuallyHidden>Actions</VisuallyHidden></Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {tokens.data?.results.map((t) => (
              <Table.Tr key={t.id}>
                <Table.Td data-label="Lookup"><Code>{t.lookup}</Code></Table.Td>
                <Table.Td data-label="Note">{t.note || "–"}</Table.Td>
                <Table.Td data-label="Status"><StateBadge state={t.status} /></Table.Td>
                <Table.Td data-label="By">{t.created_by}</Table.Td>
                <Table.Td data-label={expires}>{formatDateTime(t.expires_at)}</Table.Td>
                <Table.Td data-label="Server">{t.server || "–"}</Table.Td>
                <Table.Td>
                  {t.status === "active" && (
                    <Button size="xs" color="red" variant="subtle" onClick={() => revoke.mutate(t.id)}>Revoke</Button>
                  )}
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
      {revoke.error && <ErrorAlert error={revoke.error} title="Could not revoke" />}
    </Stack>
  );
}
