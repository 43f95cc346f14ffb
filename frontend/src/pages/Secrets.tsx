import {
  Button, Card, Code, Group, Modal, PasswordInput, Stack, Table, Text, TextInput, Title, VisuallyHidden,
} from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useRef, useState, type FormEvent, type RefObject } from "react";

import { ApiError, api } from "../api/client";
import { useMe } from "../api/hooks";
import { ConfirmButton } from "../components/ConfirmButton";
import { ProjectPicker, useProjectChoices } from "../components/ProjectPicker";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatDateTime } from "../lib/format";
import type { ProjectSecret, RegistryCredential } from "../lib/secrets";

// /projects/{slug}/secrets/ and /projects/{slug}/registries/ (docs/images.md). Values and passwords are
// write-only: the inputs are uncontrolled (what is typed never becomes an attribute of the page), read once
// when the form is sent and emptied when the server took it; no answer holds one, so none is ever shown.

/** Read a password field and empty it. */
function take(ref: RefObject<HTMLInputElement | null>): string {
  return ref.current?.value ?? "";
}
function clear(ref: RefObject<HTMLInputElement | null>) {
  if (ref.current) ref.current.value = "";
}

export function SecretsPage() {
  const me = useMe().data;
  const { choices } = useProjectChoices();
  const [picked, setPicked] = useState<string | null>(null);
  const slug = picked ?? choices[0]?.value ?? null;
  const role = me?.memberships.find((m) => m.project_slug === slug)?.role;
  const canWrite = !!me?.is_operator || role === "owner" || role === "member";
  return (
    <Stack>
      <Title order={1}>Secrets & registries</Title>
      <Text size="sm" c="dimmed">
        A project's secrets (API keys, tokens) reach its containers as environment variables or as files under{" "}
        <Code>/run/secrets/</Code>, when a booking asks for them by name. Registry credentials let the nodes pull the
        project's private images. Values are stored encrypted and are never shown again, not even here: replace one
        to change it. A new value applies from the next launch. Owners and members change them; viewers see the names.
      </Text>
      {choices.length === 0 ? (
        <Text>You are in no project.</Text>
      ) : (
        <ProjectPicker value={slug} onChange={setPicked} choices={choices} />
      )}
      {slug && <Secrets slug={slug} canWrite={canWrite} />}
      {slug && <Registries slug={slug} canWrite={canWrite} />}
    </Stack>
  );
}

function Secrets({ slug, canWrite }: { slug: string; canWrite: boolean }) {
  const queryClient = useQueryClient();
  const base = `projects/${encodeURIComponent(slug)}/secrets/`;
  const key = ["secrets", slug];
  const list = useQuery({ queryKey: key, queryFn: () => api.get<ProjectSecret[]>(base) });
  const [name, setName] = useState("");
  const [saved, setSaved] = useState<string | null>(null);
  const valueRef = useRef<HTMLInputElement>(null);
  const [replacing, setReplacing] = useState<string | null>(null);

  const create = useMutation({
    mutationFn: (body: { name: string; value: string }) => api.post<ProjectSecret>(base, body),
    onSuccess: (s) => {
      clear(valueRef);
      setName("");
      setSaved(s.name);
      create.reset(); // the value sent leaves the mutation's memory too
      queryClient.invalidateQueries({ queryKey: key });
    },
  });
  const remove = useMutation({
    mutationFn: (n: string) => api.del<void>(`${base}${encodeURIComponent(n)}/`),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: key }),
  });
  const err = create.error instanceof ApiError ? create.error : null;
  const fieldShown = err?.fieldError("name") || err?.fieldError("value");

  function submit(e: FormEvent) {
    e.preventDefault();
    setSaved(null);
    create.mutate({ name, value: take(valueRef) });
  }

  return (
    <Stack gap="sm">
      <Title order={2} size="h3">Secrets</Title>
      {canWrite && (
        <Card withBorder component="form" onSubmit={submit} aria-label="New secret" autoComplete="off">
          <Group align="flex-start">
            <TextInput label="Name" required maxLength={63} placeholder="HF_TOKEN" value={name} spellCheck={false}
              description="Letters, digits and _; also the file's name" autoComplete="off"
              onChange={(e) => setName(e.currentTarget.value)} error={err?.fieldError("name")} />
            <PasswordInput label="Value" required ref={valueRef} autoComplete="new-password" miw={260}
              description="Write-only: never shown again" error={err?.fieldError("value")} />
            <Button type="submit" mt={44} loading={create.isPending}>Add secret</Button>
          </Group>
          {create.error && !fieldShown && <ErrorAlert error={create.error} title="Could not add the secret" />}
          {saved && <Text size="sm" c="teal.9" role="status" mt="xs" data-testid="secret-saved">Saved the secret {saved}.</Text>}
        </Card>
      )}
      <QueryState isLoading={list.isLoading} error={list.error} isEmpty={list.data?.length === 0}
        empty="This project has no secrets." label="secrets">
        <ResponsiveTable minWidth={600} striped aria-label="Secrets">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th><Table.Th>Set by</Table.Th><Table.Th>Updated</Table.Th>
              <Table.Th><VisuallyHidden>Actions</VisuallyHidden></Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.map((s) => (
              <Table.Tr key={s.name} data-testid={`secret-${s.name}`}>
                <Table.Td data-label="Name"><Code>{s.name}</Code></Table.Td>
                <Table.Td data-label="Set by">{s.updated_by ?? s.created_by ?? "-"}</Table.Td>
                <Table.Td data-label="Updated">{formatDateTime(s.updated_at)}</Table.Td>
                <Table.Td>
                  {canWrite && (
                    <Group gap="xs" wrap="nowrap">
                      <Button size="xs" variant="default" aria-label={`Replace secret ${s.name}`}
                        onClick={() => setReplacing(s.name)}>
                        Replace
                      </Button>
                      <ConfirmButton size="xs" aria-label={`Delete secret ${s.name}`} title="Delete this secret?"
                        message={<>Launches after this go without <Code>{s.name}</Code>; a running container keeps what it
                          started with. A reservation not yet ended, or a queued request, that asks for it must end first.</>}
                        confirmLabel="Delete secret" errorTitle="Could not delete the secret"
                        onConfirm={() => remove.mutateAsync(s.name)}>
                        Delete
                      </ConfirmButton>
                    </Group>
                  )}
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
      {replacing && (
        <ReplaceSecret base={base} name={replacing} onClose={() => setReplacing(null)}
          onDone={() => queryClient.invalidateQueries({ queryKey: key })} />
      )}
    </Stack>
  );
}

function ReplaceSecret(props: { base: string; name: string; onClose: () => void; onDone: () => void }) {
  const valueRef = useRef<HTMLInputElement>(null);
  const put = useMutation({
    mutationFn: (value: string) => api.put<ProjectSecret>(`${props.base}${encodeURIComponent(props.name)}/`, { value }),
    onSuccess: () => {
      clear(valueRef);
      props.onDone();
      props.onClose();
    },
  });
  const err = put.error instanceof ApiError ? put.error : null;
  function submit(e: FormEvent) {
    e.preventDefault();
    put.mutate(take(valueRef));
  }
  return (
    <Modal opened onClose={props.onClose} title={`Replace the secret ${props.name}`} closeButtonProps={{ "aria-label": "Close" }}>
      <form onSubmit={submit} autoComplete="off">
        <Stack>
          <Text size="sm">The new value applies from the next launch; a running container keeps the old one.</Text>
          <PasswordInput label="New value" required ref={valueRef} autoComplete="new-password" data-autofocus
            error={err?.fieldError("value")} />
          {put.error && !err?.fieldError("value") && <ErrorAlert error={put.error} title="Could not replace the secret" />}
          <Group justify="flex-end">
            <Button variant="default" onClick={props.onClose}>Keep the current value</Button>
            <Button type="submit" loading={put.isPending}>Replace secret</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}

function Registries({ slug, canWrite }: { slug: string; canWrite: boolean }) {
  const queryClient = useQueryClient();
  const base = `projects/${encodeURIComponent(slug)}/registries/`;
  const key = ["registries", slug];
  const list = useQuery({ queryKey: key, queryFn: () => api.get<RegistryCredential[]>(base) });
  const [registry, setRegistry] = useState("");
  const [username, setUsername] = useState("");
  const [saved, setSaved] = useState<string | null>(null);
  const passwordRef = useRef<HTMLInputElement>(null);
  const [replacing, setReplacing] = useState<RegistryCredential | null>(null);

  const create = useMutation({
    mutationFn: (body: { registry: string; username: string; password: string }) => api.post<RegistryCredential>(base, body),
    onSuccess: (c) => {
      clear(passwordRef);
      setRegistry("");
      setUsername("");
      setSaved(c.registry);
      create.reset();
      queryClient.invalidateQueries({ queryKey: key });
    },
  });
  const remove = useMutation({
    mutationFn: (r: string) => api.del<void>(`${base}${encodeURIComponent(r)}/`),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: key }),
  });
  const err = create.error instanceof ApiError ? create.error : null;
  const fieldShown = err?.fieldError("registry") || err?.fieldError("username") || err?.fieldError("password");

  function submit(e: FormEvent) {
    e.preventDefault();
    setSaved(null);
    create.mutate({ registry, username, password: take(passwordRef) });
  }

  return (
    <Stack gap="sm">
      <Title order={2} size="h3">Registry credentials</Title>
      <Text size="sm" c="dimmed">
        One per registry, named as an image reference names it: <Code>docker.io</Code>, <Code>nvcr.io</Code> (user{" "}
        <Code>$oauthtoken</Code>, an NGC API key), <Code>ghcr.io</Code>, <Code>host:port</Code>. Used only for this
        project's pulls from that registry.
      </Text>
      {canWrite && (
        <Card withBorder component="form" onSubmit={submit} aria-label="New registry credential" autoComplete="off">
          <Group align="flex-start">
            <TextInput label="Registry" required placeholder="nvcr.io" value={registry} spellCheck={false} autoComplete="off"
              onChange={(e) => setRegistry(e.currentTarget.value)} error={err?.fieldError("registry")} />
            <TextInput label="Username" required value={username} spellCheck={false} autoComplete="off"
              onChange={(e) => setUsername(e.currentTarget.value)} error={err?.fieldError("username")} />
            <PasswordInput label="Password or token" required ref={passwordRef} autoComplete="new-password" miw={220}
              error={err?.fieldError("password")} />
            <Button type="submit" mt={25} loading={create.isPending}>Add credential</Button>
          </Group>
          {create.error && !fieldShown && <ErrorAlert error={create.error} title="Could not add the credential" />}
          {saved && <Text size="sm" c="teal.9" role="status" mt="xs" data-testid="registry-saved">Saved the credential for {saved}.</Text>}
        </Card>
      )}
      <QueryState isLoading={list.isLoading} error={list.error} isEmpty={list.data?.length === 0}
        empty="This project has no registry credentials; its pulls go without any." label="registry credentials">
        <ResponsiveTable minWidth={600} striped aria-label="Registry credentials">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Registry</Table.Th><Table.Th>Username</Table.Th><Table.Th>Updated</Table.Th>
              <Table.Th><VisuallyHidden>Actions</VisuallyHidden></Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {list.data?.map((c) => (
              <Table.Tr key={c.registry} data-testid={`registry-${c.registry}`}>
                <Table.Td data-label="Registry"><Code>{c.registry}</Code></Table.Td>
                <Table.Td data-label="Username">{c.username}</Table.Td>
                <Table.Td data-label="Updated">
                  {formatDateTime(c.updated_at)}{c.updated_by ? ` by ${c.updated_by}` : ""}
                </Table.Td>
                <Table.Td>
                  {canWrite && (
                    <Group gap="xs" wrap="nowrap">
                      <Button size="xs" variant="default" aria-label={`Replace credential for ${c.registry}`}
                        onClick={() => setReplacing(c)}>
                        Replace
                      </Button>
                      <ConfirmButton size="xs" aria-label={`Delete credential for ${c.registry}`} title="Delete this credential?"
                        message={<>Later pulls from <Code>{c.registry}</Code> for this project go without credentials: a private
                          image there can no longer be pulled.</>}
                        confirmLabel="Delete credential" errorTitle="Could not delete the credential"
                        onConfirm={() => remove.mutateAsync(c.registry)}>
                        Delete
                      </ConfirmButton>
                    </Group>
                  )}
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </ResponsiveTable>
      </QueryState>
      {replacing && (
        <ReplaceRegistry base={base} credential={replacing} onClose={() => setReplacing(null)}
          onDone={() => queryClient.invalidateQueries({ queryKey: key })} />
      )}
    </Stack>
  );
}

function ReplaceRegistry(props: { base: string; credential: RegistryCredential; onClose: () => void; onDone: () => void }) {
  const [username, setUsername] = useState(props.credential.username);
  const passwordRef = useRef<HTMLInputElement>(null);
  const put = useMutation({
    mutationFn: (password: string) =>
      api.put<RegistryCredential>(`${props.base}${encodeURIComponent(props.credential.registry)}/`, { username, password }),
    onSuccess: () => {
      clear(passwordRef);
      props.onDone();
      props.onClose();
    },
  });
  const err = put.error instanceof ApiError ? put.error : null;
  const fieldShown = err?.fieldError("username") || err?.fieldError("password");
  function submit(e: FormEvent) {
    e.preventDefault();
    put.mutate(take(passwordRef));
  }
  return (
    <Modal opened onClose={props.onClose} title={`Replace the credential for ${props.credential.registry}`}
      closeButtonProps={{ "aria-label": "Close" }}>
      <form onSubmit={submit} autoComplete="off">
        <Stack>
          <Text size="sm">Used from the next pull.</Text>
          <TextInput label="Username" required value={username} autoComplete="off" spellCheck={false}
            onChange={(e) => setUsername(e.currentTarget.value)} error={err?.fieldError("username")} />
          <PasswordInput label="New password or token" required ref={passwordRef} autoComplete="new-password" data-autofocus
            error={err?.fieldError("password")} />
          {put.error && !fieldShown && <ErrorAlert error={put.error} title="Could not replace the credential" />}
          <Group justify="flex-end">
            <Button variant="default" onClick={props.onClose}>Keep the current one</Button>
            <Button type="submit" loading={put.isPending}>Replace credential</Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  );
}
