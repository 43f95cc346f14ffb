// The web terminal's side of the proxy's WebSocket protocol (docs/proxy.md, "The web terminal"): keystrokes go as
// binary frames, a resize as a JSON text frame, and the close code says why the terminal ended.

/** The text frame that tells the PTY its size: sent right after the socket opens and on every resize. */
export function resizeFrame(cols: number, rows: number): string {
  return JSON.stringify({ type: "resize", cols, rows });
}

const encoder = new TextEncoder();

/** Typed text (xterm's onData, a JS string) as the UTF-8 bytes the PTY reads. */
export function keyBytes(data: string): Uint8Array {
  return encoder.encode(data);
}

/** xterm's onBinary: a string whose characters are bytes (0-255), such as some mouse reports; sent as they are. */
export function binaryBytes(data: string): Uint8Array {
  const bytes = new Uint8Array(data.length);
  for (let i = 0; i < data.length; i++) bytes[i] = data.charCodeAt(i) & 0xff;
  return bytes;
}

/** The address to connect to: the answer's ws:// or wss:// URL as it is; a path is taken relative to the page,
 * and an http(s) address becomes ws(s). */
export function socketUrl(url: string, pageHref: string): string {
  const u = new URL(url, pageHref);
  if (u.protocol === "http:") u.protocol = "ws:";
  else if (u.protocol === "https:") u.protocol = "wss:";
  return u.toString();
}

/** Close codes the proxy uses (docs/access.md). */
export const CLOSE = {
  exited: 1000,
  lost: 1006,
  upstream: 1011,
  refused: 4404,
  notReady: 4409,
  windowEnded: 4410,
} as const;

/** Why the terminal closed, in words; the proxy's reason (when it gave one) follows. */
export function closeText(code: number, reason: string): string {
  const why = reason.trim();
  const base =
    code === CLOSE.exited
      ? "The shell exited."
      : code === CLOSE.windowEnded
        ? "The reservation's window ended."
        : code === CLOSE.refused
          ? "The terminal was refused: no such reservation, or its ticket was used or expired."
          : code === CLOSE.notReady
            ? "The container is not ready for a terminal yet."
            : code === CLOSE.upstream
              ? "The connection to the container failed."
              : code === CLOSE.lost
                ? "The connection was lost."
                : `The terminal closed (code ${code}).`;
  return why ? `${base} ${why}` : base;
}

/** Whether trying again can help: not once the window is over. */
export function canReconnect(code: number): boolean {
  return code !== CLOSE.windowEnded;
}

/** Where the terminal's connection stands, for its status line. */
export type TerminalStatus =
  | { kind: "connecting" }
  | { kind: "open"; server: string }
  | { kind: "closed"; code: number; reason: string }
  | { kind: "refused"; error: unknown };
