import { TextInput } from "@mantine/core";
import { useState } from "react";

import { formatDateTime, parseDateTime, zoneLabel } from "../lib/format";
import { useShownZone } from "./ZoneToggle";

/**
 * A date and time written in the portal's one format ("01 Dec 2026, 12:00") and read in the zone shown. A
 * text field rather than the browser's datetime-local (which shows the browser's locale, "12/01/2026, 12:00
 * PM", and only its own zone) or a picker library (Mantine 8's pickers keep no zone of their own).
 */
export function DateTimeInput(props: {
  label: string;
  value: number | null;
  onChange: (ms: number) => void;
  disabled?: boolean;
  error?: string;
}) {
  const zone = useShownZone();
  const [draft, setDraft] = useState<string | null>(null); // what the user is typing, until it leaves the field
  const shown = props.value === null ? "" : formatDateTime(props.value, zone);
  const bad = draft !== null && draft.trim() !== "" && parseDateTime(draft, zone) === null;
  return (
    <TextInput
      label={props.label}
      description={`As 01 Dec 2026, 12:00, in ${zoneLabel(zone)}`}
      value={draft ?? shown}
      disabled={props.disabled}
      autoComplete="off"
      spellCheck={false}
      onChange={(e) => {
        const text = e.currentTarget.value;
        setDraft(text);
        const t = parseDateTime(text, zone);
        if (t !== null) props.onChange(t);
      }}
      onBlur={() => {
        if (!bad) setDraft(null);
      }}
      error={props.error ?? (bad ? "Write the time as 01 Dec 2026, 12:00." : undefined)}
    />
  );
}
