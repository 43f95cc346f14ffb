// A container's named ports (docs/proxy.md, "Opening an app"): the booking form's rows as `container.ports`, the form's
// own checks, and the reservation page's list of web apps (which open in the browser, which need `gpucp ssh -L`).
import type { ContainerPort, LaunchTemplate, PortProtocol, WebApp } from "../api/types";

export const PORT_PROTOCOLS: PortProtocol[] = ["http", "https", "tcp"];
/** At most this many ports per booking. */
export const MAX_PORTS = 16;
const NAME = /^[a-z][a-z0-9-]{0,31}$/;
/** The web terminal's name in the proxy; no port may take it. */
const RESERVED = "terminal";

/** One row of the booking form's "Web ports": `port` as the number field holds it ("" while empty). `auth` is the
 * row's sign-in select; `path` is not edited, a template's comes along unchanged. `key` only keeps React's rows
 * apart. */
export interface PortRow {
  key: number;
  name: string;
  port: number | "";
  protocol: PortProtocol;
  path?: string;
  auth?: ContainerPort["auth"];
}

let nextKey = 1;

export function newPortRow(fill: Partial<Omit<PortRow, "key">> = {}): PortRow {
  return { key: nextKey++, name: "", port: "", protocol: "http", ...fill };
}

/** A template's ports as the form's rows. */
export function portRows(ports: LaunchTemplate["ports"] | undefined): PortRow[] {
  return (ports ?? []).map((p) =>
    newPortRow({
      name: p.name,
      port: p.port,
      protocol: PORT_PROTOCOLS.includes(p.protocol as PortProtocol) ? (p.protocol as PortProtocol) : "http",
      ...(p.path ? { path: p.path } : {}),
      ...(p.auth ? { auth: p.auth } : {}),
    }),
  );
}

/** `container.ports` of a booking: the server fills what a row leaves out (path "/", auth "none"). */
export function portsBody(rows: PortRow[]): Partial<ContainerPort>[] {
  return rows.map((r) => ({
    name: r.name.trim(),
    port: r.port === "" ? undefined : r.port,
    protocol: r.protocol,
    ...(r.path ? { path: r.path } : {}),
    ...(r.auth ? { auth: r.auth } : {}),
  }));
}

/** The API's field name for a row's key, where its refusal lands: `container.ports.0.name`. */
export function portFieldName(index: number, key: "name" | "port" | "protocol" | "path" | "auth"): string {
  return `container.ports.${index}.${key}`;
}

/** What the form can tell before the server does, in words naming the row. */
export function portProblems(rows: PortRow[]): string[] {
  const problems: string[] = [];
  if (rows.length > MAX_PORTS) problems.push(`At most ${MAX_PORTS} web ports.`);
  const names = new Map<string, number>();
  const numbers = new Map<number, number>();
  rows.forEach((r, i) => {
    const label = `Port row ${i + 1}`;
    const name = r.name.trim();
    if (!NAME.test(name)) {
      problems.push(`${label}: a name is a lowercase letter, then up to 31 lowercase letters, digits or dashes.`);
    } else if (name === RESERVED) {
      problems.push(`${label}: the name "${RESERVED}" is the web terminal's.`);
    } else if (names.has(name)) {
      problems.push(`${label}: the name ${name} is taken by row ${names.get(name)! + 1}.`);
    } else {
      names.set(name, i);
    }
    if (r.port === "" || !Number.isInteger(r.port) || r.port < 1 || r.port > 65535) {
      problems.push(`${label}: the port is a number from 1 to 65535.`);
    } else if (numbers.has(r.port)) {
      problems.push(`${label}: port ${r.port} is taken by row ${numbers.get(r.port)! + 1}.`);
    } else {
      numbers.set(r.port, i);
    }
  });
  return problems;
}

/** A JupyterLab port: the one the page offers first. */
export function isJupyter(p: { name: string; auth?: string }): boolean {
  return p.auth === "jupyter" || p.name === "jupyter";
}

/** One line of the reservation's "Web apps": a declared port and, while the proxy serves it, its app. */
export interface WebAppLine {
  port: ContainerPort;
  /** Set while the port opens in the browser (http, listed in `access.web`). */
  app: WebApp | null;
  jupyter: boolean;
}

/** Every declared port in the booking's order, each with its app while served; a served app the ports do not
 * list (an older answer) is kept too. */
export function webAppLines(ports: ContainerPort[] | undefined, web: WebApp[] | undefined): WebAppLine[] {
  const served = new Map((web ?? []).map((w) => [w.name, w]));
  const lines: WebAppLine[] = (ports ?? []).map((p) => {
    const app = served.get(p.name);
    return { port: p, app: app && p.protocol === "http" ? app : null, jupyter: isJupyter(p) };
  });
  const listed = new Set(lines.map((l) => l.port.name));
  for (const w of web ?? []) {
    if (!listed.has(w.name)) lines.push({ port: w, app: w.protocol === "http" ? w : null, jupyter: isJupyter(w) });
  }
  return lines;
}

/** How to reach a port the browser cannot open: forwarded over ssh by the CLI. */
export function forwardCommand(reservationId: string, port: number): string {
  return `gpucp ssh ${reservationId} -L ${port}:localhost:${port}`;
}
