import {
  Badge, Button, Card, Checkbox, Code, Group, NumberInput, Progress, Select, Stack, Table, Text, TextInput, Title,
  VisuallyHidden,
} from "@mantine/core";
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";

import { ApiError, api } from "../api/client";
import { useMe } from "../api/hooks";
import type { Page } from "../api/types";
import { ConfirmButton } from "../components/ConfirmButton";
import { ErrorAlert, QueryState } from "../components/QueryState";
import { ResponsiveTable } from "../components/ResponsiveTable";
import { formatDateTime } from "../lib/format";

// GET/POST /projects/{slug}/volumes/, DELETE /projects/{slug}/volumes/{name}/ (docs/volumes.md).
export interface Volume {
  name: string;
  project: string;
  size_limit_gib: number;
  limit_bytes: number;
  shared: boolean;
  used_bytes: number | null;
  measured_at: string | null;
  used_percent: number | null;
  over_limit: boolean;
  created_by: string | null;
  created_at: string;
}

const GIB = 1024 ** 3;

function usageColor(percent: number): string {
  return percent > 100 ? "red" : percent >= 90 ? "orange" : "blue";
}

// The API judges every value (a name's rule, the size's range); the page shows its refusals under the fields.
export function VolumesPage() {
  const me = useMe();
  const queryClient = useQueryClient();
  const memberships = me.data?.memberships ?? [];
  const [chosen, setChosen] = useState<string | null>(null);
  const slug = chosen ?? memberships[0]?.project_slug ?? null;
  const role = memberships.find((m) => m.project_slug === slug)?.role;
  const canWrite = me.data?.is_operator || role === "owner" || role === "member";
  const base = slug ? `projects/${encodeURIComponent(slug)}/volumes/` : "";

  const volumes = useQuery({
    queryKey: ["volumes", slug],
    queryFn: () => api.get<Page<Volume>>(base, { limit: 500 }),
    enabled: slug !== null,
  });
  const [name, setName] = useState("");
  const [size, setSize] = useState<number | string>(10);
  const [shared, setShared] = useState(false);

  const create = useMutation({
    mutationFn: () => api.post<Volume>(base, { name, size_limit_gib: size, shared }),
    onSuccess: () => {
      setName("");
      setShared(false);
      queryClient.invalidateQueries({ queryKey: ["volumes", slug] });
    },
  });
  const remove = useMutation({
    mutationFn: (v: Volume) => api.del<void>(`${base}${encodeURIComponent(v.name)}/`),
    onSuccess: () => queryClient.invalidateQueries({ queryKey: ["volumes", slug] }),
  });
  const err = create.error instanceof ApiError ? create.error : null;
  const fieldShown = err?.fieldError("name") || err?.fieldError("size_limit_gib");

  function submit(e: FormEvent) {
    e.preventDefault();
    create.mutate();
  }

  return (
    <Stack>
      <Title order={1}>Volumes</Title>
      <Text size="sm" c="dimmed">
        A volume is a directory kept between reservations, mounted where a booking asks (default{" "}
        <Code>/workspace</Code>): <Code>gpucp book ... --volume data</Code>. Its size limit is what the project pays
        for, per GiB-hour. It is checked at booking and at launch against the last measurement; a running container
        can write past it, and its next launch is then refused. Deleting a volume does not delete its data on disk.
      </Text>
      {memberships.length > 1 && (
        <Select label="Project" data={memberships.map((m) => ({ value: m.project_slug, label: m.project_name }))}
          value={slug} onChange={(v) => setChosen(v)} allowDeselect={false} maw={320} />
      )}
      {!slug && <Text>You are in no project.</Text>}
      {slug && canWrite && (
        <Card withBorder component="form" onSubmit={submit} aria-label="New volume">
          <Group align="flex-end">
            <TextInput label="Name" required maxLength={63} placeholder="data" value={name}
              onChange={(e) => setName(e.currentTarget.value)} error={err?.fieldError("name")} />
            <NumberInput label="Size limit (GiB)" required min={1} value={size} onChange={setSize} w={160}
              error={err?.fieldError("size_limit_gib")} />
            <Checkbox label="Shared (overlapping reservations may mount it)" checked={shared}
              onChange={(e) => setShared(e.currentTarget.checked)} mb={8} />
            <Button type="submit" loading={create.isPending}>Create volume</Button>
          </Group>
          {create.error && !fieldShown && <ErrorAlert error={create.error} title="Could not create the volume" />}
        </Card>
      )}
      {slug && (
        <QueryState isLoading={volumes.isLoading} error={volumes.error} isEmpty={volumes.data?.results.length === 0}
          empty="This project has no volumes." label="Volumes">
          <ResponsiveTable minWidth={760} striped aria-label="Volumes">
              <Table.Thead>
                <Table.Tr>
                  <Table.Th>Name</Table.Th><Table.Th>Usage</Table.Th><Table.Th>Limit</Table.Th>
                  <Table.Th>Shared</Table.Th><Table.Th>Measured</Table.Th><Table.Th><VisuallyHidden>Actions</VisuallyHidden></Table.Th>
                </Table.Tr>
              </Table.Thead>
              <Table.Tbody>
                {volumes.data?.results.map((v) => (
                  <Table.Tr key={v.name} data-testid={`volume-${v.name}`}>
                    <Table.Td data-label="Name">{v.name}</Table.Td>
                    <Table.Td miw={200} data-label="Usage">
                      {v.used_percent === null || v.used_bytes === null ? (
                        <Text size="sm" c="dimmed">not measured yet</Text>
                      ) : (
                        <Stack gap={2}>
                          <Progress value={Math.min(100, v.used_percent)} color={usageColor(v.used_percent)}
                            aria-label={`${v.name} usage`} />
                          <Text size="xs">
                            {(v.used_bytes / GIB).toFixed(1)} GiB ({v.used_percent.toFixed(0)}%)
                            {v.over_limit && <Badge color="red" size="xs" ml={6}>over the limit</Badge>}
                          </Text>
                        </Stack>
                      )}
                    </Table.Td>
                    <Table.Td data-label="Limit">{v.size_limit_gib} GiB</Table.Td>
                    <Table.Td data-label="Shared">{v.shared ? "yes" : "no"}</Table.Td>
                    <Table.Td data-label="Measured">{formatDateTime(v.measured_at)}</Table.Td>
                    <Table.Td>
                      {canWrite && (
                        <ConfirmButton size="xs" aria-label={`Delete volume ${v.name}`} title="Delete this volume?"
                          message={<>"{v.name}" will no longer be mounted or charged. Its data on disk is not deleted: an operator
                            removes it, and a new volume of the same name finds it again. A reservation that mounts it must end first.</>}
                          confirmLabel="Delete volume" errorTitle="Could not delete the volume"
                          onConfirm={() => remove.mutateAsync(v)}>
                          Delete
                        </ConfirmButton>
                      )}
                    </Table.Td>
                  </Table.Tr>
                ))}
              </Table.Tbody>
          </ResponsiveTable>
        </QueryState>
      )}
    </Stack>
  );
}
