// Live logs: the follow stream's events folded into what the log panel shows, per container.

/** One event of GET /reservations/{id}/logs/?follow=1 (its `data`). */
export interface LogEvent {
  server: string;
  launch_id: string;
  generation: number;
  offset: number;
  cut: number;
  text: string;
}

export interface LaunchOutput {
  launchId: string;
  server: string;
  generation: number;
  text: string;
  /** Characters of output not shown: dropped by the control plane or the agent, or trimmed here. */
  dropped: number;
  /** Places where output is missing (the server's `cut` on an event). */
  holes: number;
}

/** The most characters kept per container in the page; the control plane keeps about 1 MiB anyway. */
export const MAX_CHARS = 1_000_000;

/** Add one event; a new array (React state), the touched entry replaced, oldest text trimmed past `max`. */
export function appendLog(outputs: LaunchOutput[], event: LogEvent, max = MAX_CHARS): LaunchOutput[] {
  const index = outputs.findIndex((o) => o.launchId === event.launch_id);
  const before: LaunchOutput =
    index >= 0
      ? outputs[index]
      : { launchId: event.launch_id, server: event.server, generation: event.generation, text: "", dropped: 0, holes: 0 };
  let text = before.text + event.text;
  let dropped = before.dropped + event.cut;
  if (text.length > max) {
    dropped += text.length - max;
    text = text.slice(text.length - max);
  }
  const holes = before.holes + (event.cut > 0 && before.text !== "" ? 1 : 0);
  const next = { ...before, text, dropped, holes };
  return index >= 0 ? outputs.map((o, i) => (i === index ? next : o)) : [...outputs, next];
}

/** Whether a scrolled box is at (or within a few pixels of) its bottom: only then does new output scroll it. */
export function atBottom(box: { scrollTop: number; clientHeight: number; scrollHeight: number }, slack = 8): boolean {
  return box.scrollTop + box.clientHeight >= box.scrollHeight - slack;
}

export function followUrl(apiRoot: string, reservationId: string): string {
  return `${apiRoot}reservations/${encodeURIComponent(reservationId)}/logs/?follow=1`;
}

/** How far an image pull has come, as the agent reports it (nodeagent/schema.py, PullProgress). */
export interface PullProgress {
  layers_done: number;
  layers_total: number;
  bytes_done: number;
  bytes_total: number;
  seconds: number;
}

/** `event: pull` of the logs stream: a launch's image is being pulled at its window. */
export interface PullEvent {
  server: string;
  launch_id: string;
  generation: number;
  image: string;
  pull: PullProgress;
}

/** Bytes as "512.3 MB" (decimal, as registries and the engine count image sizes). */
export function megabytes(bytes: number): string {
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

/** "3 of 7 layers, 120.0 MB of 480.0 MB, 12 s": how far a pull has come. */
export function pullText(p: PullProgress): string {
  const bytes = p.bytes_total > 0 ? `, ${megabytes(p.bytes_done)} of ${megabytes(p.bytes_total)}` : "";
  return `${p.layers_done} of ${p.layers_total} layers${bytes}, ${Math.round(p.seconds)} s`;
}
