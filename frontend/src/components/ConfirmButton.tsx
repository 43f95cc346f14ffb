import { Button, Group, Modal, Stack, Text, type ButtonProps } from "@mantine/core";
import { useState, type ReactNode } from "react";

import { ErrorAlert } from "./QueryState";

/**
 * A button for an action that cannot be taken back (cancel, release, revoke, delete): it asks first, in a
 * dialog that says what will happen; "keep" closes it and nothing changes. `onConfirm` returns a promise
 * (a mutation's `mutateAsync`): the dialog closes when it resolves and shows the refusal when it rejects.
 */
export function ConfirmButton(props: {
  /** The button's text, e.g. "Revoke". */
  children: ReactNode;
  /** The button's accessible name when its text alone is ambiguous in a list, e.g. "Revoke token ci". */
  "aria-label"?: string;
  /** The dialog's title, a question: "Revoke this token?". */
  title: string;
  /** What will happen, in a sentence or two. */
  message: ReactNode;
  /** The confirming button's text, naming the action: "Revoke token". */
  confirmLabel: string;
  /** The dismissing button's text. */
  keepLabel?: string;
  /** Shown with a refusal, e.g. "Could not revoke". */
  errorTitle?: string;
  onConfirm: () => Promise<unknown>;
  color?: string;
  variant?: ButtonProps["variant"];
  size?: ButtonProps["size"];
  loading?: boolean;
}) {
  const [opened, setOpened] = useState(false);
  const [pending, setPending] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const color = props.color ?? "red";

  function open() {
    setError(null);
    setOpened(true);
  }

  async function confirm() {
    setPending(true);
    setError(null);
    try {
      await props.onConfirm();
      setOpened(false);
    } catch (e) {
      setError(e);
    } finally {
      setPending(false);
    }
  }

  return (
    <>
      <Button color={color} variant={props.variant ?? "subtle"} size={props.size} loading={props.loading}
        onClick={open} aria-label={props["aria-label"]} aria-haspopup="dialog" className="rt-keep">
        {props.children}
      </Button>
      <Modal opened={opened} onClose={() => setOpened(false)} title={props.title} closeButtonProps={{ "aria-label": "Close" }}>
        <Stack>
          <Text size="sm" component="div">{props.message}</Text>
          {error !== null && <ErrorAlert error={error} title={props.errorTitle ?? "The server refused"} />}
          <Group justify="flex-end">
            <Button variant="default" onClick={() => setOpened(false)} data-autofocus>
              {props.keepLabel ?? "Keep it"}
            </Button>
            <Button color={color} loading={pending} onClick={confirm}>
              {props.confirmLabel}
            </Button>
          </Group>
        </Stack>
      </Modal>
    </>
  );
}
