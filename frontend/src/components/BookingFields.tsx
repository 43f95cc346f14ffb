import { Anchor, Checkbox, Group, MultiSelect, NumberInput, SegmentedControl, Select, Stack, Text, TextInput } from "@mantine/core";
import { useQuery } from "@tanstack/react-query";
import { useEffect } from "react";
import { Link } from "react-router";

import { api } from "../api/client";
import type { GpuModel } from "../api/types";
import { formatCredits } from "../lib/format";
import type { SpecChoice } from "../lib/queue";
import { pickSecrets, secretFieldName, type ProjectSecret, type SecretChoice } from "../lib/secrets";

/** The field errors of a refused submit, by the API's field names (first match wins). */
export type FieldError = (...names: string[]) => string | undefined;

/**
 * The GPUs asked for, shared by the booking form and the queue's: a model (with its rate) and a count. With
 * `alternatives`, also a memory floor instead of a model and whole servers instead of GPUs (the queue's spec
 * takes either; the booking form's free check and timeline want a model and a count).
 */
export function SpecFields(props: {
  models: GpuModel[];
  value: SpecChoice;
  onChange: (next: SpecChoice) => void;
  fieldErr: FieldError;
  alternatives?: boolean;
}) {
  const v = props.value;
  const set = (patch: Partial<SpecChoice>) => props.onChange({ ...v, ...patch });
  return (
    <Stack gap="sm">
      {props.alternatives && (
        <SegmentedControl
          size="xs"
          aria-label="Ask for GPUs by"
          value={v.by}
          onChange={(by) => set({ by: by as SpecChoice["by"] })}
          data={[
            { value: "model", label: "GPU model" },
            { value: "memory", label: "Least memory" },
          ]}
        />
      )}
      {v.by === "model" ? (
        <Select
          label="GPU model"
          allowDeselect={false}
          data={props.models.map((m) => ({ value: m.name, label: `${m.name} (${formatCredits(m.billing_weight)} credits/GPU-h)` }))}
          value={v.model}
          onChange={(model) => set({ model })}
          error={props.fieldErr("spec.gpu_model", "spec")}
        />
      ) : (
        <NumberInput
          label="Least GPU memory (GiB)"
          min={1}
          max={4096}
          value={v.minMemoryGib}
          onChange={(n) => set({ minMemoryGib: typeof n === "number" ? n : Number(n) || 0 })}
          error={props.fieldErr("spec.min_memory_mib", "spec")}
        />
      )}
      {props.alternatives && (
        <SegmentedControl
          size="xs"
          aria-label="Count"
          value={v.size}
          onChange={(size) => set({ size: size as SpecChoice["size"] })}
          data={[
            { value: "gpus", label: "GPUs" },
            { value: "servers", label: "Whole servers" },
          ]}
        />
      )}
      <NumberInput
        label={v.size === "gpus" ? "GPUs" : "Whole servers"}
        min={1}
        max={4096}
        value={v.count}
        onChange={(n) => set({ count: typeof n === "number" ? n : Number(n) || 0 })}
        error={props.fieldErr(v.size === "gpus" ? "spec.gpu_count" : "spec.whole_servers")}
      />
    </Stack>
  );
}

/** The container a booking or a queued request runs: its image and command (split on spaces). */
export function ContainerFields(props: {
  image: string;
  command: string;
  onImage: (image: string) => void;
  onCommand: (command: string) => void;
  fieldErr: FieldError;
}) {
  return (
    <>
      <TextInput label="Container image" value={props.image} onChange={(e) => props.onImage(e.currentTarget.value)}
        error={props.fieldErr("container.image", "container")} required />
      <TextInput label="Command" description="Split on spaces; empty runs the image's own command" value={props.command}
        onChange={(e) => props.onCommand(e.currentTarget.value)} error={props.fieldErr("container.command")} />
    </>
  );
}

/**
 * The project secrets the container gets (`container.secrets`, docs/images.md): picked by name from the
 * project's secrets, each as a variable (named like the secret unless another name is given), as the file
 * /run/secrets/<name>, or both. Values are never read here: the list holds names only.
 */
export function SecretFields(props: {
  project: string | null;
  value: SecretChoice[];
  onChange: (next: SecretChoice[]) => void;
  fieldErr: FieldError;
}) {
  const { project, value, onChange } = props;
  const secrets = useQuery({
    queryKey: ["secrets", project],
    enabled: !!project,
    queryFn: () => api.get<ProjectSecret[]>(`projects/${encodeURIComponent(project!)}/secrets/`),
  });
  const names = (secrets.data ?? []).map((s) => s.name);
  // Another project's secrets are not this one's: drop what the project (once loaded) does not have.
  const stale = secrets.data !== undefined && value.some((c) => !names.includes(c.name));
  useEffect(() => {
    if (stale) onChange(value.filter((c) => names.includes(c.name)));
  });
  if (!project || secrets.isError) return null;
  if (secrets.data && names.length === 0) {
    return (
      <Text size="xs" c="dimmed">
        No project secrets to pass to the container; add them under{" "}
        <Anchor component={Link} to="/secrets" size="xs">Secrets & registries</Anchor>.
      </Text>
    );
  }
  const set = (i: number, patch: Partial<SecretChoice>) => onChange(value.map((c, j) => (j === i ? { ...c, ...patch } : c)));
  return (
    <Stack gap={6}>
      <MultiSelect label="Secrets" description="Project secrets the container gets; their values are never shown"
        placeholder={value.length ? undefined : "None"} data={names} value={value.map((c) => c.name)} searchable clearable
        onChange={(picked) => onChange(pickSecrets(value, picked))} error={props.fieldErr("container.secrets")} />
      {value.map((c, i) => (
        <Group key={c.name} gap="xs" align="flex-start" wrap="wrap" data-testid={`secret-choice-${c.name}`}>
          <Checkbox mt={8} label={`${c.name} as a variable`} checked={c.asEnv}
            onChange={(e) => set(i, { asEnv: e.currentTarget.checked })} />
          {c.asEnv && (
            <TextInput size="xs" w={180} label={`Variable for ${c.name}`} placeholder={c.name} value={c.env} spellCheck={false}
              onChange={(e) => set(i, { env: e.currentTarget.value })} error={props.fieldErr(secretFieldName(i, "env"))} />
          )}
          <Checkbox mt={8} label={`as /run/secrets/${c.name}`} checked={c.file}
            onChange={(e) => set(i, { file: e.currentTarget.checked })} error={props.fieldErr(secretFieldName(i, "file"))} />
          {props.fieldErr(secretFieldName(i, "name")) && (
            <Text size="xs" c="red.9" w="100%">{props.fieldErr(secretFieldName(i, "name"))}</Text>
          )}
        </Group>
      ))}
    </Stack>
  );
}
