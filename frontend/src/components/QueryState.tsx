import { Alert, Center, Loader, Stack, Text } from "@mantine/core";
import type { ReactNode } from "react";

import { ApiError } from "../api/client";

/** One way to show loading, failure and emptiness, so every page behaves the same. */
export function QueryState(props: {
  isLoading: boolean;
  error: unknown;
  isEmpty?: boolean;
  empty?: ReactNode;
  label?: string;
  children?: ReactNode;
}) {
  if (props.isLoading) {
    return (
      <Center p="md" aria-busy="true">
        <Loader size="sm" aria-label={`Loading ${props.label ?? ""}`.trim()} />
      </Center>
    );
  }
  if (props.error) return <ErrorAlert error={props.error} title={`Could not load ${props.label ?? "this"}`} />;
  if (props.isEmpty) {
    return (
      <Text c="dimmed" p="md" ta="center">
        {props.empty ?? "Nothing here yet."}
      </Text>
    );
  }
  return <>{props.children}</>;
}

export function ErrorAlert({ error, title }: { error: unknown; title?: string }) {
  const message = error instanceof Error ? error.message : String(error);
  const fields = error instanceof ApiError ? Object.entries(error.fields) : [];
  return (
    <Alert color="red" title={title ?? "Something went wrong"} role="alert">
      <Stack gap={4}>
        <Text size="sm">{message}</Text>
        {fields.length > 1 &&
          fields.map(([name, msgs]) => (
            <Text size="xs" key={name}>
              <b>{name}</b>: {msgs.join(" ")}
            </Text>
          ))}
      </Stack>
    </Alert>
  );
}

/** For features whose API is still being built: say so plainly instead of showing made-up data. */
export function NotAvailable({ what }: { what: string }) {
  return (
    <Alert color="gray" title="Not available yet" data-testid="not-available">
      {what} is not offered by this control plane's API yet. It will appear here once the server provides it.
    </Alert>
  );
}
