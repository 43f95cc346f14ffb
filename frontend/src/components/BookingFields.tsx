import { NumberInput, SegmentedControl, Select, Stack, TextInput } from "@mantine/core";

import type { GpuModel } from "../api/types";
import { formatCredits } from "../lib/format";
import type { SpecChoice } from "../lib/queue";

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
