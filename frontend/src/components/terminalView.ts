// The web terminal: xterm.js on a shell in the reservation's container, through the proxy's WebSocket
// (docs/proxy.md, "The web terminal"). Imported only when a terminal is opened (TerminalPanel in WebApps.tsx), so
// neither the main bundle nor the reservation page carries xterm. Plain DOM, no React, Mantine or API client:
// the ticket, the status line and the buttons are the panel's, so this chunk shares no module with the pages and
// the bundler's split of their shared code (what every first load fetches) stays as it was.
import "@xterm/xterm/css/xterm.css";

import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";

import type { TerminalTicket } from "../api/types";
import { binaryBytes, keyBytes, resizeFrame, socketUrl, type TerminalStatus } from "../lib/terminal";

export interface TerminalView {
  /** Connect with a new one-time ticket (POST reservations/{id}/terminal/), closing any socket still open. */
  connect(ticket: () => Promise<TerminalTicket>): void;
  dispose(): void;
}

/** A terminal drawn in `holder`, sized to it; `onStatus` hears how each connection stands. */
export function mountTerminal(holder: HTMLElement, onStatus: (status: TerminalStatus) => void): TerminalView {
  const term = new Terminal({
    cursorBlink: true,
    fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace",
    fontSize: 14,
    scrollback: 5000,
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(holder);
  fit.fit();

  let socket: WebSocket | null = null;
  let generation = 0; // a connection's callbacks act only while it is the latest
  let connected = false;
  const send = (data: Uint8Array | string) => {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(data);
  };
  const subscriptions = [
    term.onData((d) => send(keyBytes(d))),
    term.onBinary((d) => send(binaryBytes(d))),
    term.onResize(({ cols, rows }) => send(resizeFrame(cols, rows))),
  ];
  const observer = new ResizeObserver(() => fit.fit());
  observer.observe(holder);

  function close() {
    generation++;
    const ws = socket;
    socket = null;
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000);
  }

  function connect(ticket: () => Promise<TerminalTicket>) {
    close();
    const mine = generation;
    if (connected) term.write("\r\n");
    connected = true;
    onStatus({ kind: "connecting" });
    ticket().then(
      (answer) => {
        if (mine !== generation) return;
        const ws = new WebSocket(socketUrl(answer.url, window.location.href));
        ws.binaryType = "arraybuffer";
        socket = ws;
        ws.onopen = () => {
          if (mine !== generation) return;
          onStatus({ kind: "open", server: answer.server });
          fit.fit();
          ws.send(resizeFrame(term.cols, term.rows));
          term.focus();
        };
        ws.onmessage = (e: MessageEvent) => {
          // Output is binary: a UTF-8 stream that may split a character, which xterm joins across writes.
          if (mine === generation && e.data instanceof ArrayBuffer) term.write(new Uint8Array(e.data));
        };
        ws.onclose = (e: CloseEvent) => {
          if (mine !== generation) return;
          socket = null;
          onStatus({ kind: "closed", code: e.code, reason: e.reason });
        };
      },
      (error: unknown) => {
        if (mine === generation) onStatus({ kind: "refused", error });
      },
    );
  }

  return {
    connect,
    dispose() {
      close();
      observer.disconnect();
      subscriptions.forEach((s) => s.dispose());
      term.dispose();
    },
  };
}
