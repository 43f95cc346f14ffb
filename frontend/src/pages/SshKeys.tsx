import { Button, Card, Code, Group, Stack, Table, Text, Textarea, TextInput, Title, VisuallyHidden } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";

import { ApiError, api } from "../api/client";
import type { Page, SshKey } from "../api/types";
import { ConfirmButton } from "../components/ConfirmButton";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatDateTime } from "../lib/format";

// The API judges every key (docs/access.md, "Keys"); the page only shows its refusals under the fields.
export function SshKeysPage() {
  const queryClient = useQueryClient();
  const keys = useQuery({ queryKey: ["ssh-keys"], queryFn: () => api.get<Page<SshKey>>("ssh-keys/", { limit: 500 }) });
  const [name, setName] = useState("");
  const [publicKey, setPublicKey] = useState("");
  const [added, setAdded] = useState<SshKey | null>(null);

  const create = useMutation({
    mutationFn: () => api.post<SshKey>("ssh-keys/", { name, public_key: publicKey }),
    onSuccess: (key) => {
      setAdded(key);
      setName("");
      setPublicKey("");
      queryClient.invalidateQueries({ queryKey: ["ssh-keys"] });
    },
  });
  const remove = useMutation({
    mutationFn: (id: number) => api.del<void>(`ssh-keys/${id}/`),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["ssh-keys"] }),
  });
  const err = create.error instanceof ApiError ? create.error : null;
  const fieldShown = err?.fieldError("name") || err?.fieldError("public_key");

  function submit(e: FormEvent) {
    e.preventDefault();
    setAdded(null);
    create.mutate();
  }

  return (
    <Stack>
      <Title order={1}>SSH keys</Title>
      <Text size="sm" c="dimmed">
        The SSH gateways let you into your projects' running reservations with these keys. Paste a public key, the
        one line of a <Code>.pub</Code> file such as <Code>~/.ssh/id_ed25519.pub</Code>: ed25519, ECDSA, or RSA of
        2048 bits or more. Never paste the private key. From a terminal: <Code>gpucp keys add ~/.ssh/id_ed25519.pub</Code>.
      </Text>
      <Card withBorder component="form" onSubmit={submit} aria-label="New SSH key">
        <Stack>
          <TextInput label="Name" required maxLength={100} value={name} onChange={(e) => setName(e.currentTarget.value)}
            error={err?.fieldError("name")} />
          <Textarea label="Public key" required autosize minRows={3} placeholder="ssh-ed25519 AAAA... you@laptop"
            spellCheck={false} styles={{ input: { fontFamily: "monospace" } }} value={publicKey}
            onChange={(e) => setPublicKey(e.currentTarget.value)} error={err?.fieldError("public_key")} />
          <Group>
            <Button type="submit" loading={create.isPending}>Add key</Button>
          </Group>
          {create.error && !fieldShown && <ErrorAlert error={create.error} title="Could not add the key" />}
          {added && (
            <Text size="sm" c="green" data-testid="added-key">
              Added "{added.name}": <Code>{added.fingerprint}</Code>
            </Text>
          )}
        </Stack>
      </Card>
      <QueryState isLoading={keys.isLoading} error={keys.error} isEmpty={keys.data?.results.length === 0}
        empty="You have no SSH keys." label="SSH keys">
        <ResponsiveTable minWidth={700} striped aria-label="SSH keys">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th><Table.Th>Type</Table.Th><Table.Th>Fingerprint</Table.Th>
              <Table.Th>Comment</Table.Th><Table.Th>Added</Table.Th><Table.Th><VisuallyHidden>Actions</VisuallyHidden></Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {keys.data?.results.map((k) => (
              <Table.Tr key={k.id} data-testid={`ssh-key-${k.id}`}>
                <Table.Td data-label="Name">{k.name}</Table.Td>
                <Table.Td data-label="Type">{k.key_type} ({k.bits} bits)</Table.Td>
                <Table.Td data-label="Fingerprint"><Code>{k.fingerprint}</Code></Table.Td>
                <Table.Td data-label="Comment">{k.comment}</Table.Td>
                <Table.Td data-label="Added">{formatDateTime(k.created_at)}</Table.Td>
                <Table.Td>
                  <ConfirmButton size="xs" aria-label={`Delete key ${k.name}`} title="Delete this SSH key?"
                    message={<>"{k.name}" (<Code>{k.fingerprint}</Code>) will no longer open SSH sessions. This cannot be undone; you can add the key again.</>}
                    confirmLabel="Delete key" errorTitle="Could not delete the key"
                    onConfirm={() => remove.mutateAsync(k.id)}>
                    Delete
                  </ConfirmButton>
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
    </Stack>
  );
}
