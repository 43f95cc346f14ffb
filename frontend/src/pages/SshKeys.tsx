import { Button, Card, Code, Group, Modal, Stack, Table, Text, Textarea, TextInput, Title } from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";

import { ApiError, api } from "../api/client";
import type { Page, SshKey } from "../api/types";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { formatDateTime } from "../lib/format";

// The API judges every key (docs/access.md, "Keys"); the page only shows its refusals under the fields.
export function SshKeysPage() {
  const queryClient = useQueryClient();
  const keys = useQuery({ queryKey: ["ssh-keys"], queryFn: () => api.get<Page<SshKey>>("ssh-keys/", { limit: 500 }) });
  const [name, setName] = useState("");
  const [publicKey, setPublicKey] = useState("");
  const [added, setAdded] = useState<SshKey | null>(null);
  const [doomed, setDoomed] = useState<SshKey | null>(null);

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
    onSuccess: () => {
      setDoomed(null);
      queryClient.invalidateQueries({ queryKey: ["ssh-keys"] });
    },
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
      <Title order={2}>SSH keys</Title>
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
        <Table.ScrollContainer minWidth={700}>
          <Table striped>
            <Table.Thead>
              <Table.Tr>
                <Table.Th>Name</Table.Th><Table.Th>Type</Table.Th><Table.Th>Fingerprint</Table.Th>
                <Table.Th>Comment</Table.Th><Table.Th>Added</Table.Th><Table.Th />
              </Table.Tr>
            </Table.Thead>
            <Table.Tbody>
              {keys.data?.results.map((k) => (
                <Table.Tr key={k.id} data-testid={`ssh-key-${k.id}`}>
                  <Table.Td>{k.name}</Table.Td>
                  <Table.Td>{k.key_type} ({k.bits} bits)</Table.Td>
                  <Table.Td><Code>{k.fingerprint}</Code></Table.Td>
                  <Table.Td>{k.comment}</Table.Td>
                  <Table.Td>{formatDateTime(k.created_at)}</Table.Td>
                  <Table.Td>
                    <Button size="xs" color="red" variant="subtle" onClick={() => { remove.reset(); setDoomed(k); }}
                      aria-label={`Delete key ${k.name}`}>
                      Delete
                    </Button>
                  </Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      </QueryState>
      <Modal opened={doomed !== null} onClose={() => setDoomed(null)} title="Delete this SSH key?">
        {doomed && (
          <Stack>
            <Text size="sm">
              "{doomed.name}" (<Code>{doomed.fingerprint}</Code>) will no longer open SSH sessions. This cannot be
              undone; you can add the key again.
            </Text>
            {remove.error && <ErrorAlert error={remove.error} title="Could not delete the key" />}
            <Group justify="flex-end">
              <Button variant="default" onClick={() => setDoomed(null)}>Keep it</Button>
              <Button color="red" loading={remove.isPending} onClick={() => remove.mutate(doomed.id)}>Delete key</Button>
            </Group>
          </Stack>
        )}
      </Modal>
    </Stack>
  );
}
