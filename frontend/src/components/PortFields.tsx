import { Button, Fieldset, Group, NativeSelect, NumberInput, Stack, Text, TextInput } from "@mantine/core";

import { MAX_PORTS, newPortRow, PORT_PROTOCOLS, portFieldName, type PortRow } from "../lib/ports";
import type { FieldError } from "./BookingFields";

/**
 * The container's named ports (`container.ports`, docs/proxy.md): a name and a port per row, the protocol (only
 * http opens in the browser, the others are reached with `gpucp ssh -L`) and the sign-in: "jupyter" gives the lab
 * a token and opens it signed in. A template's rows keep the path Open lands on, said under the row.
 */
export function PortFields(props: { value: PortRow[]; onChange: (next: PortRow[]) => void; fieldErr: FieldError }) {
  const { value, onChange, fieldErr } = props;
  const set = (i: number, patch: Partial<PortRow>) => onChange(value.map((r, j) => (j === i ? { ...r, ...patch } : r)));
  const listError = fieldErr("container.ports");
  return (
    <Fieldset legend="Web ports" variant="unstyled" p={0} data-testid="port-fields">
      <Stack gap={6}>
        <Text size="xs" c="dimmed">
          What the container serves, by name: http ports open in the browser from the reservation page.
        </Text>
        {value.map((r, i) => {
          const n = i + 1;
          const first = i === 0;
          const rowError = fieldErr(`container.ports.${i}`);
          const extra = [r.path && r.path !== "/" ? `opens at ${r.path}` : "", r.auth === "jupyter" ? "signed in to JupyterLab" : ""]
            .filter(Boolean)
            .join(", ");
          return (
            <Stack key={r.key} gap={2} data-testid={`port-row-${i}`}>
              <Group gap="xs" align="flex-start" wrap="nowrap">
                <TextInput size="xs" style={{ flex: 1, minWidth: 0 }} spellCheck={false} placeholder="jupyter"
                  label={first ? "Name" : undefined} aria-label={first ? undefined : `Name of web port ${n}`}
                  value={r.name} onChange={(e) => set(i, { name: e.currentTarget.value })}
                  error={fieldErr(portFieldName(i, "name"))} />
                <NumberInput size="xs" w={88} min={1} max={65535} allowDecimal={false} hideControls placeholder="8888"
                  label={first ? "Port" : undefined} aria-label={first ? undefined : `Port number of web port ${n}`}
                  value={r.port} onChange={(v) => set(i, { port: typeof v === "number" ? v : v === "" ? "" : Number(v) || "" })}
                  error={fieldErr(portFieldName(i, "port"))} />
                <NativeSelect size="xs" w={80} data={PORT_PROTOCOLS}
                  label={first ? "Protocol" : undefined} aria-label={first ? undefined : `Protocol of web port ${n}`}
                  value={r.protocol} onChange={(e) => set(i, { protocol: e.currentTarget.value as PortRow["protocol"] })}
                  error={fieldErr(portFieldName(i, "protocol"))} />
                <NativeSelect size="xs" w={92} data={[{ value: "none", label: "none" }, { value: "jupyter", label: "jupyter" }]}
                  label={first ? "Sign-in" : undefined} aria-label={first ? undefined : `Sign-in of web port ${n}`}
                  value={r.auth ?? "none"}
                  onChange={(e) => set(i, { auth: e.currentTarget.value === "jupyter" ? "jupyter" : undefined })}
                  error={fieldErr(portFieldName(i, "auth"))} />
                <Button size="xs" variant="subtle" color="red" mt={first ? 22 : 0} px={6}
                  aria-label={`Remove web port ${n}${r.name ? ` (${r.name})` : ""}`}
                  onClick={() => onChange(value.filter((_, j) => j !== i))}>
                  Remove
                </Button>
              </Group>
              {extra && <Text size="xs" c="dimmed">{r.name || `Port ${n}`} {extra}.</Text>}
              {[rowError, fieldErr(portFieldName(i, "path"))].filter(Boolean).map((m) => (
                <Text key={m} size="xs" c="red.9">{m}</Text>
              ))}
            </Stack>
          );
        })}
        <Group gap="xs">
          <Button size="xs" variant="light" disabled={value.length >= MAX_PORTS} onClick={() => onChange([...value, newPortRow()])}>
            Add a web port
          </Button>
        </Group>
        {listError && <Text size="xs" c="red.9" role="alert">{listError}</Text>}
      </Stack>
    </Fieldset>
  );
}
