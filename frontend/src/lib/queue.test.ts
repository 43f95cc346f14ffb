import { describe, expect, it } from "vitest";

import type { PriorityClass, QueuedRequest } from "../api/types";
import {
  cancellable,
  classDescription,
  classInfo,
  classLabel,
  multiplierText,
  operatorActions,
  preemptedBy,
  reasonText,
  specBody,
  specText,
  standing,
  submitBody,
  submitProblems,
  toQueueEntry,
  type SubmitForm,
} from "./queue";

// The classes as GET priority-classes/ answers them: the terms are the API's, never the portal's.
const klass = (patch: Partial<PriorityClass> = {}): PriorityClass => ({
  name: "normal",
  rank: 0,
  credit_multiplier: "1.000",
  notice_seconds: 0,
  preemptible: false,
  restricted: false,
  allowed: true,
  ...patch,
});
const CLASSES: PriorityClass[] = [
  klass({ name: "high", rank: 100, credit_multiplier: "1.500", restricted: true, allowed: false }),
  klass(),
  klass({ name: "preemptible", rank: -100, credit_multiplier: "0.500", notice_seconds: 120, preemptible: true }),
];

const form = (patch: Partial<SubmitForm> = {}): SubmitForm => ({
  project: "alpha",
  name: "train",
  spec: { by: "model", model: "H100-80GB", minMemoryGib: 40, size: "gpus", count: 4 },
  durationHours: 1.5,
  startBy: null,
  priorityClass: "normal",
  requeue: false,
  image: "img:1",
  command: "python  train.py --resume ",
  ...patch,
});

const request = (patch: Partial<QueuedRequest> = {}): QueuedRequest => ({
  id: "11111111-2222-3333-4444-555555555555",
  project: "alpha",
  name: "train",
  spec: { gpu_model: "H100-80GB", min_memory_mib: null, gpu_count: 4, whole_servers: null },
  container: null,
  duration_seconds: 3600,
  start_by: null,
  priority_class: "normal",
  state: "queued",
  reason: "waiting for 4 x H100-80GB",
  reservation: null,
  requeue: false,
  requeued_from: null,
  created_at: "2026-12-01T10:00:00Z",
  started_at: null,
  ...patch,
});

describe("the submit body", () => {
  it("sends a model and a count, the duration in seconds, the command split on spaces", () => {
    const body = submitBody(form(), CLASSES);
    expect(body).toEqual({
      project: "alpha",
      name: "train",
      spec: { gpu_model: "H100-80GB", gpu_count: 4 },
      duration: 5400,
      priority_class: "normal",
      requeue: false,
      container: { image: "img:1", command: ["python", "train.py", "--resume"], env: {} },
    });
  });

  it("sends a memory floor in MiB and whole servers instead, never both of a pair", () => {
    expect(specBody({ by: "memory", model: "H100-80GB", minMemoryGib: 80, size: "servers", count: 2 })).toEqual({
      min_memory_mib: 81920,
      whole_servers: 2,
    });
  });

  it("sends start_by as an ISO instant only when set", () => {
    const at = Date.parse("2026-12-02T14:00:00Z");
    expect(submitBody(form({ startBy: at }), CLASSES).start_by).toBe("2026-12-02T14:00:00.000Z");
    expect("start_by" in submitBody(form(), CLASSES)).toBe(false);
  });

  it("sends requeue only with a preemptible class", () => {
    expect(submitBody(form({ requeue: true }), CLASSES).requeue).toBe(false);
    expect(submitBody(form({ requeue: true, priorityClass: "preemptible" }), CLASSES).requeue).toBe(true);
    // Before the classes load, nothing is known to be preemptible: requeue is not sent.
    expect(submitBody(form({ requeue: true, priorityClass: "preemptible" }), undefined).requeue).toBe(false);
  });

  it("follows the API when an operator makes another class preemptible", () => {
    const edited = CLASSES.map((c) => (c.name === "normal" ? { ...c, preemptible: true } : c));
    expect(submitBody(form({ requeue: true }), edited).requeue).toBe(true);
  });
});

describe("the form's own checks", () => {
  it("passes a complete form", () => {
    expect(submitProblems(form())).toEqual([]);
  });

  it("names each missing or impossible value", () => {
    const p = submitProblems(
      form({ project: null, name: " ", durationHours: 0, image: "", startBy: 1000, spec: { by: "memory", model: null, minMemoryGib: 0, size: "servers", count: 0 } }),
      2000,
    );
    expect(p).toEqual([
      "Pick a project.",
      "Give the request a name.",
      "Give the least GPU memory, in GiB.",
      "Ask for at least one server.",
      "The duration must be more than zero.",
      "Start by must be in the future.",
      "Give a container image.",
    ]);
  });
});

describe("a request in words", () => {
  it("puts a spec in words", () => {
    expect(specText({ gpu_model: "H100-80GB", gpu_count: 4 })).toBe("4 x H100-80GB");
    expect(specText({ min_memory_mib: 81920, whole_servers: 1 })).toBe("1 whole server of GPUs of >= 80 GiB");
  });

  it("gives the position of a waiting request, and the state of any other", () => {
    expect(standing({ ...request(), position: 3, estimated_start: null, events: [] })).toBe("#3 in the queue");
    expect(standing(request({ state: "held" }))).toBe("held by an operator");
    expect(standing(request({ state: "cancelled" }))).toBe("cancelled");
  });

  it("offers cancel only while it waits", () => {
    expect(cancellable(request())).toBe(true);
    expect(cancellable(request({ state: "held" }))).toBe(true);
    expect(cancellable(request({ state: "started" }))).toBe(false);
    expect(cancellable(request({ state: "failed" }))).toBe(false);
  });

  it("finds a class's terms in the API's list", () => {
    expect(classInfo(CLASSES, "preemptible")).toMatchObject({ preemptible: true, credit_multiplier: "0.500", notice_seconds: 120 });
    expect(classInfo(CLASSES, "nonesuch")).toBeUndefined();
    expect(classInfo(undefined, "normal")).toBeUndefined();
  });
});

describe("a class in words", () => {
  it("labels a class by its name, capitalised", () => {
    expect(classLabel("preemptible")).toBe("Preemptible");
    expect(classLabel("high")).toBe("High");
  });

  it("puts the multiplier against the booking rate, trailing zeros dropped", () => {
    expect(multiplierText("1.000")).toBe("The booking rate");
    expect(multiplierText("0.500")).toBe("0.5 x the booking rate");
    expect(multiplierText("1.250")).toBe("1.25 x the booking rate");
  });

  it("describes a preemptible class with its notice, from the data", () => {
    expect(classDescription(CLASSES[2])).toBe(
      "0.5 x the booking rate. Runs only on GPUs nobody booked; when a booking needs them it yields them after 120 s of notice (SIGUSR1 and /run/gpucp/warning, then SIGTERM).",
    );
    expect(classDescription({ ...CLASSES[2], notice_seconds: 300, credit_multiplier: "0.250" })).toMatch(/^0\.25 x .* after 300 s of notice/);
  });

  it("describes a class that is never preempted", () => {
    expect(classDescription(CLASSES[0])).toBe("1.5 x the booking rate. Never interrupted once started.");
    expect(classDescription(CLASSES[1])).toBe("The booking rate. Never interrupted once started.");
  });
});

describe("the operators' view", () => {
  it("makes a queue row of a plain request, the optional fields null when the server has none", () => {
    const e = toQueueEntry(request());
    expect(e).toMatchObject({ position: null, spec: "4 x H100-80GB", fair_share_factor: null, blocked_by: null, blocked_until: null });
    const blocked = toQueueEntry(request({ blocked_by: "r-1", blocked_until: "2026-12-01T14:00:00Z" }));
    expect(blocked.blocked_by).toBe("r-1");
  });

  it("offers hold on a queued request, release on a held one, a class change on both", () => {
    expect(operatorActions("queued")).toEqual({ hold: true, release: false, changeClass: true });
    expect(operatorActions("held")).toEqual({ hold: false, release: true, changeClass: true });
    expect(operatorActions("started")).toEqual({ hold: false, release: false, changeClass: false });
  });
});

describe("preemption events", () => {
  it("names the winner from the event's data", () => {
    expect(preemptedBy({ preempted_by: "abc", ends_at: "x" })).toBe("abc");
    expect(preemptedBy({ preempted_by: null })).toBeNull();
    expect(preemptedBy({ ends_at: "x" })).toBeNull();
    expect(preemptedBy(null)).toBeNull();
  });
});

describe("reasonText", () => {
  it("writes the server's ISO instants in the one format and the zone shown", () => {
    const r = "The earliest window of this length that fits starts at 2026-12-01T23:19:00Z.";
    expect(reasonText(r, "UTC")).toBe("The earliest window of this length that fits starts at 01 Dec 2026, 23:19.");
    expect(reasonText("blocked by reservation X until 2026-12-01T14:00:00+00:00", "Europe/Berlin")).toBe(
      "blocked by reservation X until 01 Dec 2026, 15:00",
    );
    expect(reasonText("waiting for 4 x H100-80GB", "UTC")).toBe("waiting for 4 x H100-80GB");
  });
});
