import { describe, expect, it } from "vitest";

import { submitBody, submitProblems, type SubmitForm } from "./queue";
import {
  newChoice,
  pickSecrets,
  secretFieldName,
  secretProblems,
  secretsBody,
  secretUseText,
  warningsOf,
  warningText,
  type SecretChoice,
} from "./secrets";

const choice = (patch: Partial<SecretChoice> & { name: string }): SecretChoice => ({ ...newChoice(patch.name), ...patch });

describe("secretsBody", () => {
  it("sends the name alone for a variable named like the secret (the API's default)", () => {
    expect(secretsBody([choice({ name: "HF_TOKEN" })])).toEqual([{ name: "HF_TOKEN" }]);
    expect(secretsBody([choice({ name: "HF_TOKEN", env: "HF_TOKEN" })])).toEqual([{ name: "HF_TOKEN" }]);
    expect(secretsBody([choice({ name: "HF_TOKEN", env: "   " })])).toEqual([{ name: "HF_TOKEN" }]);
  });

  it("names another variable, trimmed", () => {
    expect(secretsBody([choice({ name: "WANDB_API_KEY", env: " WANDB_KEY " })])).toEqual([
      { name: "WANDB_API_KEY", env: "WANDB_KEY" },
    ]);
  });

  it("a file only sends no env, so no variable is set", () => {
    expect(secretsBody([choice({ name: "KEY", asEnv: false, file: true, env: "IGNORED" })])).toEqual([
      { name: "KEY", file: true },
    ]);
  });

  it("both: the variable is named explicitly, since file alone would set none", () => {
    expect(secretsBody([choice({ name: "KEY", file: true })])).toEqual([{ name: "KEY", env: "KEY", file: true }]);
    expect(secretsBody([choice({ name: "KEY", file: true, env: "K2" })])).toEqual([{ name: "KEY", env: "K2", file: true }]);
  });

  it("keeps the order picked", () => {
    expect(secretsBody([choice({ name: "B" }), choice({ name: "A" })]).map((s) => s.name)).toEqual(["B", "A"]);
  });
});

describe("pickSecrets", () => {
  it("keeps what was said about the ones still picked and starts new ones as a variable", () => {
    const current = [choice({ name: "A", env: "X", file: true }), choice({ name: "B" })];
    expect(pickSecrets(current, ["A", "C"])).toEqual([choice({ name: "A", env: "X", file: true }), newChoice("C")]);
    expect(pickSecrets(current, [])).toEqual([]);
  });
});

describe("secretProblems", () => {
  it("wants a variable, a file or both", () => {
    expect(secretProblems([choice({ name: "A", asEnv: false })])).toEqual(["Give A as a variable, a file or both."]);
    expect(secretProblems([choice({ name: "A", asEnv: false, file: true })])).toEqual([]);
  });

  it("refuses one variable set twice, by default name or given name", () => {
    expect(secretProblems([choice({ name: "A" }), choice({ name: "B", env: "A" })])).toEqual([
      "The variable A is set by two secrets.",
    ]);
    expect(secretProblems([choice({ name: "A" }), choice({ name: "B", env: "A", asEnv: false, file: true })])).toEqual([]);
    expect(secretProblems([choice({ name: "A" }), choice({ name: "B" })])).toEqual([]);
  });
});

describe("in words", () => {
  it("says where a reservation's secret is", () => {
    expect(secretUseText({ name: "HF_TOKEN", env: "HF_TOKEN", file: false })).toBe("HF_TOKEN as $HF_TOKEN");
    expect(secretUseText({ name: "KEY", env: null, file: true })).toBe("KEY as /run/secrets/KEY");
    expect(secretUseText({ name: "KEY", env: "K", file: true })).toBe("KEY as $K and /run/secrets/KEY");
  });

  it("a warning is the server's sentence, else said for the image check, else its code", () => {
    expect(warningText({ code: "image_not_checked", message: "The registry could not be reached." })).toBe(
      "The registry could not be reached.",
    );
    expect(warningText({ code: "image_not_checked", image: "r.example/a:1", registry: "r.example" })).toContain(
      "r.example/a:1 could not be checked (r.example was not reachable)",
    );
    expect(warningText({ code: "budget_exceeded" })).toBe("budget_exceeded");
  });

  it("reads warnings from any answer, keeping only objects with a code", () => {
    expect(warningsOf(null)).toEqual([]);
    expect(warningsOf({})).toEqual([]);
    expect(warningsOf({ warnings: "no" })).toEqual([]);
    expect(warningsOf({ warnings: [{ code: "image_not_checked" }, "x", null, { message: "no code" }] })).toEqual([
      { code: "image_not_checked" },
    ]);
  });

  it("names a secret's field as the API does", () => {
    expect(secretFieldName(2, "env")).toBe("container.secrets.2.env");
  });
});

describe("a queued request's secrets", () => {
  const form: SubmitForm = {
    project: "demo",
    name: "run",
    spec: { by: "model", model: "H100", minMemoryGib: 0, size: "gpus", count: 1 },
    durationHours: 1,
    startBy: null,
    priorityClass: "normal",
    requeue: false,
    image: "img:1",
    command: "",
  };

  it("go in the container only when picked", () => {
    expect((submitBody(form, []).container as Record<string, unknown>).secrets).toBeUndefined();
    const body = submitBody({ ...form, secrets: [choice({ name: "HF_TOKEN", file: true })] }, []);
    expect((body.container as Record<string, unknown>).secrets).toEqual([{ name: "HF_TOKEN", env: "HF_TOKEN", file: true }]);
  });

  it("their problems are the form's", () => {
    expect(submitProblems({ ...form, secrets: [choice({ name: "A", asEnv: false })] })).toEqual([
      "Give A as a variable, a file or both.",
    ]);
  });
});
