// The queue's logic the pages share: what each priority class (as the API lists them) means in words, the request body a submit form
// sends, and a request's state, position and estimate in words.

import type { PriorityClass, QueueEntry, QueuedRequest, QueuedRequestDetail, Spec } from "../api/types";
import { formatDateTime, formatDuration, formatMiB } from "./format";
import { secretProblems, secretsBody, type SecretChoice } from "./secrets";

/** A class's name as a label: "preemptible" -> "Preemptible". Wording only; every term comes from the API. */
export function classLabel(name: string): string {
  return name ? name.charAt(0).toUpperCase() + name.slice(1) : name;
}

/** A price factor in words against the booking rate: "1" -> "The booking rate", "0.500" -> "0.5 x the booking
 * rate". The API's string decimal, with its trailing zeros dropped. */
export function multiplierText(multiplier: string): string {
  const m = Number(multiplier);
  if (!Number.isFinite(m)) return `${multiplier} x the booking rate`;
  return m === 1 ? "The booking rate" : `${m} x the booking rate`;
}

/** What choosing a class means, built from the API's terms for it (docs/scheduling.md, the classes' table). */
export function classDescription(c: PriorityClass): string {
  const price = `${multiplierText(c.credit_multiplier)}.`;
  if (c.preemptible) {
    return (
      `${price} Runs only on GPUs nobody booked; when a booking needs them it yields them after ` +
      `${c.notice_seconds} s of notice (SIGUSR1 and /run/gpucp/warning, then SIGTERM).`
    );
  }
  return `${price} Never interrupted once started.`;
}

/** Why a class is shown but cannot be chosen: a restricted class none of the caller's projects is granted. */
export const CLASS_NOT_ALLOWED = "Restricted: your project's quota policy does not include it.";

export function classInfo(classes: PriorityClass[] | undefined, name: string | null | undefined): PriorityClass | undefined {
  return classes?.find((c) => c.name === name);
}

/** How the GPUs are asked for: a model or a memory floor; a count of GPUs or of whole servers. */
export interface SpecChoice {
  by: "model" | "memory";
  model: string | null;
  /** GiB, as typed; sent in MiB. */
  minMemoryGib: number;
  size: "gpus" | "servers";
  count: number;
}

/** The API's `spec` from the form's choice: exactly one of model / memory, one of count / whole servers. */
export function specBody(c: SpecChoice): Partial<Spec> {
  const spec: Partial<Spec> = {};
  if (c.by === "model") spec.gpu_model = c.model;
  else spec.min_memory_mib = Math.round(c.minMemoryGib * 1024);
  if (c.size === "gpus") spec.gpu_count = c.count;
  else spec.whole_servers = c.count;
  return spec;
}

/** A spec in words: "4 x H100-80GB", "2 whole servers of >= 80 GiB GPUs". */
export function specText(spec: Partial<Spec>): string {
  const what = spec.gpu_model ?? (spec.min_memory_mib ? `GPUs of >= ${formatMiB(spec.min_memory_mib)}` : "any GPUs");
  if (spec.whole_servers) return `${spec.whole_servers} whole server${spec.whole_servers === 1 ? "" : "s"} of ${what}`;
  return `${spec.gpu_count ?? 1} x ${what}`;
}

export interface SubmitForm {
  project: string | null;
  name: string;
  spec: SpecChoice;
  durationHours: number;
  startBy: number | null;
  priorityClass: string;
  requeue: boolean;
  image: string;
  command: string;
  /** Project secrets the container gets (lib/secrets.ts). */
  secrets?: SecretChoice[];
}

/** The body of POST requests/. `requeue` only goes with a preemptible class (only there is it meaningful), as
 * the API's list of classes says. */
export function submitBody(f: SubmitForm, classes: PriorityClass[] | undefined): Record<string, unknown> {
  const preemptible = classInfo(classes, f.priorityClass)?.preemptible ?? false;
  return {
    project: f.project,
    name: f.name,
    spec: specBody(f.spec),
    duration: Math.round(f.durationHours * 3600),
    ...(f.startBy !== null ? { start_by: new Date(f.startBy).toISOString() } : {}),
    priority_class: f.priorityClass,
    requeue: preemptible && f.requeue,
    container: {
      image: f.image,
      command: commandWords(f.command),
      env: {},
      ...(f.secrets?.length ? { secrets: secretsBody(f.secrets) } : {}),
    },
  };
}

/** A command line split on spaces, as the booking form sends it; empty runs the image's own command. */
export function commandWords(command: string): string[] {
  return command.trim() ? command.trim().split(/\s+/) : [];
}

/** What the form can tell before the server does; the server's field errors are shown at the fields too. */
export function submitProblems(f: SubmitForm, now: number = Date.now()): string[] {
  const problems: string[] = [];
  if (!f.project) problems.push("Pick a project.");
  if (!f.name.trim()) problems.push("Give the request a name.");
  if (f.spec.by === "model" && !f.spec.model) problems.push("Pick a GPU model.");
  if (f.spec.by === "memory" && !(f.spec.minMemoryGib > 0)) problems.push("Give the least GPU memory, in GiB.");
  if (!(f.spec.count >= 1)) problems.push(f.spec.size === "gpus" ? "Ask for at least one GPU." : "Ask for at least one server.");
  if (!(f.durationHours > 0)) problems.push("The duration must be more than zero.");
  if (f.startBy !== null && f.startBy <= now) problems.push("Start by must be in the future.");
  if (!f.image.trim()) problems.push("Give a container image.");
  problems.push(...secretProblems(f.secrets ?? []));
  return problems;
}

/** Where a request stands, in a few words, for the queue's table. */
export function standing(r: QueuedRequest | QueuedRequestDetail): string {
  const d = r as Partial<QueuedRequestDetail>;
  if (r.state === "queued") {
    const at = d.position ? `#${d.position} in the queue` : "queued";
    return at;
  }
  if (r.state === "held") return "held by an operator";
  if (r.state === "started") return "started";
  return r.state;
}

/** States the owner may still cancel (docs/scheduling.md: queued, and held once operators hold requests). */
export function cancellable(r: QueuedRequest): boolean {
  return r.state === "queued" || r.state === "held";
}

export function durationText(r: { duration_seconds: number }): string {
  return formatDuration(r.duration_seconds);
}

/** Preemption events on a reservation: their data names the winner (`preempted_by`). */
export function preemptedBy(data: unknown): string | null {
  if (data && typeof data === "object" && "preempted_by" in data) {
    const v = (data as { preempted_by: unknown }).preempted_by;
    return typeof v === "string" && v ? v : null;
  }
  return null;
}

/** A row of the operators' whole-queue view from a plain request, for servers without requests/queue/ yet
 * (the list is every project's to an operator): no position or fair share, the spec put in words here. */
export function toQueueEntry(r: QueuedRequest): QueueEntry {
  return {
    position: null,
    id: r.id,
    project: r.project,
    name: r.name,
    priority_class: r.priority_class,
    state: r.state,
    spec: specText(r.spec),
    duration_seconds: r.duration_seconds,
    fair_share_factor: null,
    reason: r.reason,
    blocked_by: r.blocked_by ?? null,
    blocked_until: r.blocked_until ?? null,
    created_at: r.created_at,
  };
}

/** The operators' actions a row offers: hold a queued request, release a held one; a class change for both. */
export function operatorActions(state: string): { hold: boolean; release: boolean; changeClass: boolean } {
  return { hold: state === "queued", release: state === "held", changeClass: state === "queued" || state === "held" };
}

const ISO_INSTANT = /\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})/g;

/** The server's reason with each ISO 8601 instant in it ("... fits starts at 2026-12-01T23:19:00Z") written
 * the portal's one way, in the zone shown, as every other time on the page. */
export function reasonText(reason: string, zone?: string): string {
  return reason.replace(ISO_INSTANT, (iso) => (Number.isNaN(Date.parse(iso)) ? iso : formatDateTime(iso, zone)));
}
