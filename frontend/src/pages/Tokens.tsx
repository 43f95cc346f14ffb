import { Alert, Button, Card, Code, CopyButton, Group, Stack, Table, Text, TextInput, Title, VisuallyHidden } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";

import { ApiError, api } from "../api/client";
import type { ApiToken, ApiTokenCreated, Page } from "../api/types";
import { ConfirmButton } from "../components/ConfirmButton";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatDateTime } from "../lib/format";

export function TokensPage() {
  const queryClient = useQueryClient();
  const tokens = useQuery({ queryKey: ["tokens"], queryFn: () => api.get<Page<ApiToken>>("tokens/", { limit: 200 }) });
  const [name, setName] = useState("");
  const [expires, setExpires] = useState("");
  const [created, setCreated] = useState<ApiTokenCreated | null>(null);

  const create = useMutation({
    mutationFn: () =>
      api.post<ApiTokenCreated>("tokens/", { name, expires_at: expires ? new Date(expires).toISOString() : null }),
    onSuccess: (t) => {
      setCreated(t);
      setName("");
      queryClient.invalidateQueries({ queryKey: ["tokens"] });
    },
  });
  const revoke = useMutation({
    mutationFn: (id: number) => api.post<ApiToken>(`tokens/${id}/revoke/`),
    onSuccess: (_, id) => {
      // A revoked token's secret is worthless and should not stay on screen to be copied.
      setCreated((shown) => (shown?.id === id ? null : shown));
      queryClient.invalidateQueries({ queryKey: ["tokens"] });
    },
  });
  const err = create.error instanceof ApiError ? create.error : null;

  function submit(e: FormEvent) {
    e.preventDefault();
    create.mutate();
  }

  return (
    <Stack>
      <Title order={1}>API tokens</Title>
      <Text size="sm" c="dimmed">
        Tokens let scripts use the API as you: send <Code>Authorization: Bearer &lt;token&gt;</Code>.
      </Text>
      <Card withBorder component="form" onSubmit={submit} aria-label="New token">
        <Group align="flex-end">
          <TextInput label="Name" required value={name} onChange={(e) => setName(e.currentTarget.value)} error={err?.fieldError("name")} />
          <TextInput type="datetime-local" label="Expires (optional)" value={expires}
            onChange={(e) => setExpires(e.currentTarget.value)} error={err?.fieldError("expires_at")} />
          <Button type="submit" loading={create.isPending}>Create token</Button>
        </Group>
        {create.error && !err?.fieldError("name") && !err?.fieldError("expires_at") && <ErrorAlert error={create.error} />}
      </Card>
      {created && (
        <Alert color="green" title={`Token "${created.name}" created`} withCloseButton closeButtonLabel="Dismiss" onClose={() => setCreated(null)}
          data-testid="new-token">
          <Text size="sm">Copy it now: it is shown only this once and cannot be recovered.</Text>
          <Group mt="xs" wrap="nowrap" align="flex-start">
            <Code style={{ wordBreak: "break-all", minWidth: 0 }}>{created.token}</Code>
            <CopyButton value={created.token}>
              {({ copied, copy }) => (
                <Button size="xs" variant="light" onClick={copy} className="rt-keep" aria-label="Copy the token">
                  {copied ? "Copied" : "Copy"}
                </Button>
              )}
            </CopyButton>
          </Group>
        </Alert>
      )}
      <QueryState isLoading={tokens.isLoading} error={tokens.error} isEmpty={tokens.data?.results.length === 0}
        empty="You have no API tokens." label="tokens">
        <ResponsiveTable minWidth={600} striped aria-label="API tokens">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th><Table.Th>Prefix</Table.Th><Table.Th>Created</Table.Th>
              <Table.Th>Expires</Table.Th><Table.Th>Last used</Table.Th><Table.Th>Status</Table.Th>
              <Table.Th><VisuallyHidden>Actions</VisuallyHidden></Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {tokens.data?.results.map((t) => (
              <Table.Tr key={t.id} data-testid={`token-${t.id}`}>
                <Table.Td data-label="Name">{t.name}</Table.Td>
                <Table.Td data-label="Prefix"><Code>{t.prefix}</Code></Table.Td>
                <Table.Td data-label="Created">{formatDateTime(t.created_at)}</Table.Td>
                <Table.Td data-label="Expires">{t.expires_at ? formatDateTime(t.expires_at) : "never"}</Table.Td>
                <Table.Td data-label="Last used">{t.last_used_at ? formatDateTime(t.last_used_at) : "never"}</Table.Td>
                <Table.Td data-label="Status">{t.active ? "active" : t.revoked_at ? "revoked" : "expired"}</Table.Td>
                <Table.Td>
                  {t.active && (
                    <ConfirmButton size="xs" aria-label={`Revoke token ${t.name}`} title="Revoke this token?"
                      message={<>Scripts using "{t.name}" (<Code>{t.prefix}…</Code>) are refused from now on. This cannot be undone; create a new token to replace it.</>}
                      confirmLabel="Revoke token" keepLabel="Keep it" errorTitle="Could not revoke"
                      onConfirm={() => revoke.mutateAsync(t.id)}>
                      Revoke
                    </ConfirmButton>
                  )}
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
    </Stack>
  );
}
