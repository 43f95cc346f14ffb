// What every browser script under tests/e2e/ shares: the browser (Debian's Chromium driven by playwright-core;
// no browser is ever downloaded), signing in and out, screenshots, steps, and the axe-core accessibility check.
//
// Environment: PORTAL_URL, TENANT_USER/TENANT_PASSWORD, OPERATOR_USER/OPERATOR_PASSWORD, ARTIFACTS_DIR,
// CHROMIUM (default /usr/bin/chromium), E2E_TIMEZONE (default UTC).

import { generateKeyPairSync } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const frontend = resolve(here, "../../frontend");
const require = createRequire(join(frontend, "package.json"));
const { chromium } = require("playwright-core");
const AXE_SOURCE = require.resolve("axe-core/axe.min.js");

export const BASE = process.env.PORTAL_URL ?? "http://127.0.0.1:8000";
export const ARTIFACTS = resolve(process.env.ARTIFACTS_DIR ?? resolve(here, "../../test-artifacts"));
export const tenant = { user: process.env.TENANT_USER ?? "alice", password: process.env.TENANT_PASSWORD };
export const operator = { user: process.env.OPERATOR_USER ?? "operator", password: process.env.OPERATOR_PASSWORD };
export const DESKTOP = { width: 1440, height: 900 };
export const PHONE = { width: 390, height: 844 };

mkdirSync(ARTIFACTS, { recursive: true });

const steps = [];
export function step(name) {
  steps.push(name);
  console.log(`e2e | ${name}`);
}

export function expect(cond, message) {
  if (!cond) throw new Error(message);
}

export async function shot(page, name) {
  await page.waitForTimeout(300); // let charts finish their entry animation
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

export async function signIn(page, who) {
  await page.goto(`${BASE}/`);
  await page.waitForURL(/\/login/);
  await page.getByLabel("Username").fill(who.user);
  await page.getByLabel("Password").fill(who.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByTestId("signed-in-as").waitFor();
}

export async function signOut(page) {
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(/\/login/);
}

/** A fresh ed25519 public key in OpenSSH's one-line form: the key type and the public bytes, each length-prefixed. */
export function sshPublicKey(comment) {
  const raw = Buffer.from(generateKeyPairSync("ed25519").publicKey.export({ format: "jwk" }).x, "base64url");
  const part = (bytes) => {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(bytes.length);
    return Buffer.concat([length, bytes]);
  };
  return `ssh-ed25519 ${Buffer.concat([part(Buffer.from("ssh-ed25519")), part(raw)]).toString("base64")} ${comment}`;
}

/** A session on the API as `who` (cookies kept by hand), for what a script sets up around the browser. */
export async function apiSession(who) {
  const cookies = {};
  const call = async (method, path, body) => {
    // The server closes idle keep-alive connections after a couple of seconds; a request sent on one just as it
    // closes fails without reaching it. Such a failure is retried: a POST carries an Idempotency-Key, so it is
    // made once however often it arrives (docs/api.md, "Idempotency").
    const key = method === "GET" ? {} : { "Idempotency-Key": crypto.randomUUID() };
    let res;
    for (let attempt = 1; ; attempt++) {
      try {
        res = await fetch(`${BASE}/api/v1/${path}`, {
          method,
          headers: {
            "Content-Type": "application/json",
            Cookie: Object.entries(cookies).map(([k, v]) => `${k}=${v}`).join("; "),
            "X-CSRFToken": cookies.csrftoken ?? "",
            Referer: `${BASE}/`,
            ...key,
          },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        break;
      } catch (e) {
        if (attempt >= 4) throw e;
        await new Promise((r) => setTimeout(r, 300));
      }
    }
    for (const c of res.headers.getSetCookie()) {
      const [pair] = c.split(";");
      const at = pair.indexOf("=");
      cookies[pair.slice(0, at)] = pair.slice(at + 1);
    }
    const text = await res.text();
    return { status: res.status, data: text ? JSON.parse(text) : null };
  };
  await call("GET", "auth/csrf/");
  const login = await call("POST", "auth/login/", { username: who.user, password: who.password });
  expect(login.status < 300, `${who.user} signs in to the API: ${login.status}`);
  return call;
}

/** A node agent as its wire format says: enrolls with a join token as `hostname`, then each `beat(events)` is a
 * heartbeat reporting one `gpu` ({uuid, index, name, memory_total_mib, vendor?}) with the sample `fields`, and
 * the launches it was told to run as running (no container runtime behind it) until told to stop them.
 * `every(ms)` keeps it beating, as a live agent does, until `stop()`. */
export async function fakeAgent(token, { hostname, gpu, fields }) {
  const post = async (path, data, headers = {}) => {
    let res;
    for (let attempt = 1; ; attempt++) {
      try {
        res = await fetch(`${BASE}/api/v1/${path}`, {
          method: "POST",
          headers: { "Content-Type": "application/json", Accept: "application/json", ...headers },
          body: JSON.stringify(data),
        });
        break;
      } catch (e) {
        // A dropped keep-alive connection (see apiSession); an agent retries its heartbeat the same way.
        if (attempt >= 4 || path === "agent/enroll") throw e;
        await new Promise((r) => setTimeout(r, 300));
      }
    }
    const text = await res.text();
    if (!res.ok) throw new Error(`${path}: HTTP ${res.status} ${text}`);
    return JSON.parse(text);
  };
  const { credential } = await post("agent/enroll", { schema_version: 1, join_token: token, hostname, simulated: true });
  const launches = new Map(); // launch id -> its container report
  let seq = 0;
  let timer = null;
  const beat = async (events = []) => {
    const now = new Date().toISOString();
    const reply = await post(
      "agent/heartbeat",
      {
        schema_version: 1,
        seq: ++seq,
        sent_at: now,
        node: { hostname, agent_version: "e2e", backend: "simulated", simulated: true },
        gpus: [gpu],
        samples: [{ uuid: gpu.uuid, ts: now, fields }],
        events,
        containers: [...launches.values()],
      },
      { Authorization: `Bearer ${credential}` },
    );
    for (const d of reply.desired ?? []) {
      if (!launches.has(d.launch_id)) {
        launches.set(d.launch_id, {
          launch_id: d.launch_id, reservation: d.reservation, container_id: `e2e-${d.launch_id}`.slice(0, 64),
          state: "running", gpu_uuids: d.gpu_uuids, started_at: now,
        });
      }
    }
    for (const id of reply.stop ?? []) {
      const launch = launches.get(id);
      if (launch && launch.state === "running") Object.assign(launch, { state: "exited", finished_at: now, exit_code: 0 });
    }
  };
  const every = (ms) => {
    timer = setInterval(() => beat().catch((e) => console.log(`e2e | ${hostname} heartbeat failed: ${e}`)), ms);
  };
  return { beat, every, stop: () => clearInterval(timer) };
}

const axeResults = {};

/**
 * Runs axe-core on the page as it is now and fails on any critical or serious violation (unless AXE_REPORT_ONLY
 * is set). Every result is kept
 * (ARTIFACTS_DIR/axe-<script>.json), so the counts per page can be compared across runs.
 */
export async function axeCheck(page, name) {
  // Colours are judged as they end up: a dialog fading in is, for its first 200 ms, its colours blended with the
  // page behind (axe would measure those). Wait for running CSS transitions and animations to finish (bounded).
  await page.evaluate(async () => {
    // A transition starts a frame or two after its element mounts.
    await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
    await Promise.race([
      Promise.all(
        document
          .getAnimations()
          .filter((a) => a.effect?.getTiming().iterations !== Infinity) // a spinner never finishes
          .map((a) => a.finished.catch(() => undefined)),
      ),
      new Promise((resolve) => setTimeout(resolve, 2000)),
    ]);
  });
  if (!(await page.evaluate(() => typeof window.axe !== "undefined"))) await page.addScriptTag({ path: AXE_SOURCE });
  const result = await page.evaluate(async () => {
    const r = await window.axe.run(document, { resultTypes: ["violations"] });
    return r.violations.map((v) => ({
      id: v.id,
      impact: v.impact,
      help: v.help,
      nodes: v.nodes.slice(0, 5).map((n) => `${n.target.join(" ")}: ${n.failureSummary?.split("\n").slice(0, 2).join(" ")}`),
      count: v.nodes.length,
    }));
  });
  const counts = { critical: 0, serious: 0, moderate: 0, minor: 0 };
  for (const v of result) counts[v.impact] = (counts[v.impact] ?? 0) + v.count;
  axeResults[name] = { counts, violations: result };
  console.log(`e2e | axe ${name}: ${JSON.stringify(counts)}`);
  const bad = result.filter((v) => v.impact === "critical" || v.impact === "serious");
  // AXE_REPORT_ONLY=1 records every page's counts without stopping at the first one (for before/after tables).
  if (process.env.AXE_REPORT_ONLY) return;
  expect(bad.length === 0, `axe on ${name}: ${bad.map((v) => `${v.impact} ${v.id} (${v.help}): ${v.nodes.join(" | ")}`).join(" || ")}`);
}

/** A fresh headless Chromium with a profile of its own (no cookies, no storage): `{ context, close }`.
 * Options: timezoneId (default E2E_TIMEZONE or UTC), viewport, locale. */
export async function browserContext(options = {}) {
  const profile = mkdtempSync(join(tmpdir(), "portal-e2e-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
    viewport: options.viewport ?? DESKTOP,
    acceptDownloads: true,
    timezoneId: options.timezoneId ?? process.env.E2E_TIMEZONE ?? "UTC",
    locale: options.locale ?? "en-US",
  });
  context.setDefaultTimeout(20_000);
  const close = async () => {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { context, close };
}

/**
 * Runs `body(page, context)` in a fresh headless Chromium; prints PASS or FAIL with the step that failed and
 * sets the exit code. Options: timezoneId (default E2E_TIMEZONE or UTC), viewport, script (a name for artifacts).
 */
export async function run(script, body, options = {}) {
  const { context, close } = await browserContext(options);
  const page = await context.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  try {
    await body(page, context);
    expect(pageErrors.length === 0, `no uncaught errors in the page: ${pageErrors.join(" | ")}`);
    console.log(`e2e | PASS ${script} (${steps.length} steps); screenshots in ${ARTIFACTS}`);
  } catch (err) {
    await page.screenshot({ path: join(ARTIFACTS, `failure-${script}.png`), fullPage: true }).catch(() => {});
    // And every other tab the script opened (an app the portal opened, say), as it was.
    const tabs = context.pages().filter((p) => p !== page && p.url() !== "about:blank");
    for (const [i, tab] of tabs.entries()) {
      await tab.screenshot({ path: join(ARTIFACTS, `failure-${script}-tab${i + 1}.png`), fullPage: true }).catch(() => {});
    }
    console.error(`e2e | FAIL ${script} at step "${steps[steps.length - 1]}": ${err && err.stack ? err.stack : err}`);
    process.exitCode = 1;
  } finally {
    writeFileSync(join(ARTIFACTS, `axe-${script}.json`), JSON.stringify(axeResults, null, 2));
    await close();
  }
}
