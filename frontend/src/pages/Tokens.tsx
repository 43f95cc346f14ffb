import { Alert, Button, Card, Code, CopyButton, Group, Stack, Table, Text, TextInput, Title } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";

import { ApiError, api } from "../api/client";
import type { ApiToken, ApiTokenCreated, Page } from "../api/types";
import { ErrorAlert, QueryState } from "../components/QueryState";
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
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["tokens"] }),
  });
  const err = create.error instanceof ApiError ? create.error : null;

  function submit(e: FormEvent) {
    e.preventDefault();
    create.mutate();
  }

  return (
    <Stack>
      <Title order={2}>API tokens</Title>
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
        <Alert color="green" title={`Token "${created.name}" created`} withCloseButton onClose={() => setCreated(null)}
          data-testid="new-token">
          <Text size="sm">Copy it now: it is shown only this once and cannot be recovered.</Text>
          <Group mt="xs" wrap="nowrap">
            <Code style={{ wordBreak: "break-all" }}>{created.token}</Code>
            <CopyButton value={created.token}>
              {({ copied, copy }) => <Button size="xs" variant="light" onClick={copy}>{copied ? "Copied" : "Copy"}</Button>}
            </CopyButton>
          </Group>
        </Alert>
      )}
      <QueryState isLoading={tokens.isLoading} error={tokens.error} isEmpty={tokens.data?.results.length === 0}
        empty="You have no API tokens." label="tokens">
        <Table.ScrollContainer minWidth={600}>
          <Table striped>
            <Table.Thead>
              <Table.Tr>
                <Table.Th>Name</Table.Th><Table.Th>Prefix</Table.Th><Table.Th>Created</Table.Th>
                <Table.Th>Expires</Table.Th><Table.Th>Last used</Table.Th><Table.Th>Status</Table.Th><Table.Th />
              </Table.Tr>
            </Table.Thead>
            <Table.Tbody>
              {tokens.data?.results.map((t) => (
                <Table.Tr key={t.id}>
                  <Table.Td>{t.name}</Table.Td>
                  <Table.Td><Code>{t.prefix}</Code></Table.Td>
                  <Table.Td>{formatDateTime(t.created_at)}</Table.Td>
                  <Table.Td>{t.expires_at ? formatDateTime(t.expires_at) : "never"}</Table.Td>
                  <Table.Td>{t.last_used_at ? formatDateTime(t.last_used_at) : "never"}</Table.Td>
                  <Table.Td>{t.active ? "active" : t.revoked_at ? "revoked" : "expired"}</Table.Td>
                  <Table.Td>
                    {t.active && (
                      <Button size="xs" color="red" variant="subtle" loading={revoke.isPending && revoke.variables === t.id}
                        onClick={() => revoke.mutate(t.id)} aria-label={`Revoke token ${t.name}`}>
                        Revoke
                      </Button>
                    )}
                  </Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      </QueryState>
      {revoke.error && <ErrorAlert error={revoke.error} title="Could not revoke" />}
    </Stack>
  );
}
