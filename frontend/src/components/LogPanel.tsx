import { Alert, Badge, Card, Group, Stack, Text } from "@mantine/core";
import { useEffect, useLayoutEffect, useRef, useState } from "react";

import { API_ROOT } from "../api/client";
import { appendLog, atBottom, followUrl, pullText, type LaunchOutput, type LogEvent, type PullEvent } from "../lib/logs";

type Status = "connecting" | "live" | "reconnecting" | "ended" | "unavailable";

const STATUS_TEXT: Record<Status, string> = {
  connecting: "connecting…",
  live: "live",
  reconnecting: "reconnecting…",
  ended: "all containers ended",
  unavailable: "not available",
};

/** The reservation's container output as it comes (Server-Sent Events from the logs endpoint). The browser
 * reconnects by itself with the last event's id, so nothing is shown twice; `end` closes the stream. */
export function LogPanel({ reservationId }: { reservationId: string }) {
  const [outputs, setOutputs] = useState<LaunchOutput[]>([]);
  const [status, setStatus] = useState<Status>("connecting");
  const [pulls, setPulls] = useState<Record<string, PullEvent>>({});

  useEffect(() => {
    setOutputs([]);
    setPulls({});
    setStatus("connecting");
    const source = new EventSource(followUrl(API_ROOT, reservationId));
    source.onopen = () => setStatus("live");
    source.onmessage = (message: MessageEvent<string>) => {
      let event: LogEvent;
      try {
        event = JSON.parse(message.data) as LogEvent;
      } catch {
        return;
      }
      setOutputs((current) => appendLog(current, event));
    };
    // The image being pulled at the window, before the container writes anything.
    source.addEventListener("pull", (message: MessageEvent<string>) => {
      try {
        const event = JSON.parse(message.data) as PullEvent;
        setPulls((current) => ({ ...current, [event.launch_id]: event }));
      } catch {
        return;
      }
    });
    source.addEventListener("end", () => {
      source.close();
      setStatus("ended");
    });
    source.onerror = () => {
      // CLOSED: the answer was no event stream (an error in JSON); CONNECTING: the browser retries by itself.
      setStatus(source.readyState === EventSource.CLOSED ? "unavailable" : "reconnecting");
    };
    return () => source.close();
  }, [reservationId]);

  return (
    <Card withBorder aria-labelledby="logs-title">
      <Group justify="space-between" mb="xs">
        <Text fw={600} id="logs-title">
          Output
        </Text>
        <Badge variant="light" color={status === "live" ? "green" : status === "unavailable" ? "red" : "gray"}>
          {STATUS_TEXT[status]}
        </Badge>
      </Group>
      {Object.values(pulls).map((p) => (
        <Text key={p.launch_id} size="sm" ff="monospace" data-testid="log-pull">
          {p.server}: pulling {p.image}: {pullText(p.pull)}
        </Text>
      ))}
      {outputs.length === 0 ? (
        <Text size="sm" c="dimmed">
          {status === "unavailable" ? "Live output is not available." : "No output yet."}
        </Text>
      ) : (
        <Stack gap="sm">
          {outputs.map((output) => (
            <LaunchLog key={output.launchId} output={output} titled={outputs.length > 1} />
          ))}
        </Stack>
      )}
    </Card>
  );
}

function LaunchLog({ output, titled }: { output: LaunchOutput; titled: boolean }) {
  const box = useRef<HTMLPreElement>(null);
  // Follow the end unless the reader scrolled up to look at something; scrolling back down resumes it.
  const stick = useRef(true);

  useLayoutEffect(() => {
    const el = box.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  }, [output.text]);

  const label = `Output of ${output.server}${output.generation > 1 ? `, generation ${output.generation}` : ""}`;
  return (
    <Stack gap={4}>
      {titled && (
        <Text size="sm" fw={500}>
          {output.server} {output.generation > 1 && <Text span size="xs" c="dimmed">generation {output.generation}</Text>}
        </Text>
      )}
      {output.dropped > 0 && (
        <Alert variant="light" color="yellow" p="xs">
          <Text size="xs">
            Cut: about {output.dropped.toLocaleString()} bytes of this output are not shown
            {output.holes > 0
              ? ` (older output beyond what is kept, and ${output.holes} part(s) lost while the node could not reach the control plane)`
              : " (older output beyond what is kept)"}
            .
          </Text>
        </Alert>
      )}
      <pre
        ref={box}
        className="logpanel"
        role="log"
        aria-live="polite"
        aria-label={label}
        tabIndex={0}
        onScroll={(e) => {
          stick.current = atBottom(e.currentTarget);
        }}
      >
        {output.text}
      </pre>
    </Stack>
  );
}
