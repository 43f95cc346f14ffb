// Project secrets and registry credentials (docs/images.md): the shapes the API answers, the booking form's
// choice of secrets as the API's `container.secrets`, and a booking's warnings in words. Values and passwords
// are write-only: nothing here holds one longer than the form that sends it.

/** GET projects/{slug}/secrets/: a name and who set it, never the value. */
export interface ProjectSecret {
  name: string;
  set: boolean;
  created_by: string | null;
  created_at: string;
  updated_by: string | null;
  updated_at: string;
}

/** GET projects/{slug}/registries/: the registry and the user name, never the password. */
export interface RegistryCredential {
  registry: string;
  username: string;
  set: boolean;
  created_by: string | null;
  created_at: string;
  updated_by: string | null;
  updated_at: string;
}

/** One secret a reservation gets, as its answers show it (names only). */
export interface SecretUse {
  name: string;
  env: string | null;
  file: boolean;
}

/** A warning a booking was let through with (`warnings` of the booking answer). */
export interface BookingWarning {
  code: string;
  message?: string;
  image?: string;
  registry?: string;
  [key: string]: unknown;
}

/** One secret picked in the booking form: as a variable (named `env`, or like the secret when blank), a file, or both. */
export interface SecretChoice {
  name: string;
  asEnv: boolean;
  env: string;
  file: boolean;
}

export function newChoice(name: string): SecretChoice {
  return { name, asEnv: true, env: "", file: false };
}

/** The picked names, in order, keeping what was already said about the ones still picked. */
export function pickSecrets(current: SecretChoice[], names: string[]): SecretChoice[] {
  const byName = new Map(current.map((c) => [c.name, c]));
  return names.map((n) => byName.get(n) ?? newChoice(n));
}

/** `container.secrets` of a booking: with neither env nor file the API sets the variable named like the secret. */
export function secretsBody(choices: SecretChoice[]): { name: string; env?: string; file?: true }[] {
  return choices.map((c) => {
    const env = c.env.trim();
    if (c.asEnv && !c.file) return env && env !== c.name ? { name: c.name, env } : { name: c.name };
    if (c.asEnv && c.file) return { name: c.name, env: env || c.name, file: true };
    return { name: c.name, file: true };
  });
}

/** What the form can tell before the server does; the server judges variable names and what the project has. */
export function secretProblems(choices: SecretChoice[]): string[] {
  const problems: string[] = [];
  for (const c of choices) {
    if (!c.asEnv && !c.file) problems.push(`Give ${c.name} as a variable, a file or both.`);
  }
  const seen = new Set<string>();
  for (const c of choices) {
    if (!c.asEnv) continue;
    const env = c.env.trim() || c.name;
    if (seen.has(env)) problems.push(`The variable ${env} is set by two secrets.`);
    seen.add(env);
  }
  return problems;
}

/** A secret's place in the container, in words: "$HF_TOKEN", "/run/secrets/KEY", or both. */
export function secretUseText(s: SecretUse): string {
  const where = [
    ...(s.env ? [`$${s.env}`] : []),
    ...(s.file ? [`/run/secrets/${s.name}`] : []),
  ];
  return `${s.name} as ${where.length ? where.join(" and ") : `$${s.name}`}`;
}

/** A booking's warning in words: the server's sentence, else its code. */
export function warningText(w: BookingWarning): string {
  if (typeof w.message === "string" && w.message) return w.message;
  if (w.code === "image_not_checked") {
    return `The image ${w.image ?? ""} could not be checked${w.registry ? ` (${w.registry} was not reachable)` : ""}; the pull before the window tells you if it cannot be pulled.`;
  }
  return w.code;
}

/** The warnings of an answer, whatever it holds: only objects with a code. */
export function warningsOf(answer: unknown): BookingWarning[] {
  if (!answer || typeof answer !== "object") return [];
  const list = (answer as { warnings?: unknown }).warnings;
  if (!Array.isArray(list)) return [];
  return list.filter((w): w is BookingWarning => !!w && typeof w === "object" && typeof (w as { code?: unknown }).code === "string");
}

/** The field error of a picked secret's part (`container.secrets.<i>.env`), by the API's dotted names. */
export function secretFieldName(index: number, part: "name" | "env" | "file"): string {
  return `container.secrets.${index}.${part}`;
}
