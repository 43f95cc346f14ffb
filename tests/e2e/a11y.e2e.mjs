// Portal-wide accessibility and sign-in (issue 12): the skip link, named modal close buttons, visible focus on
// inputs, sign-in returning to the page asked for (and never to another site), a signed-out load that logs no
// error, an unknown reservation asked for once, and the API docs rendering with every external request blocked.
// Then the idle-reclamation banner (issue 14): a reservation whose GPU reports 0 % utilization is warned by the
// real reclaimer (beat, every minute) under an idle policy of the demo project, and the banner with its
// "Keep it" button is checked by axe, then kept.
//
// The idle GPU is an MI250X (in the catalog, in no server of the demo fleet) on an agent this script enrolls
// and speaks for, as operator.e2e.mjs does: it reports the GPU at 0 % and the reservation's container as
// running. The demo fleet's own GPUs run their containers busy (85-100 %), so the policy (under 5 % for 5
// minutes) warns nothing else. It leaves the system as it found it: the policy's idle fields are put back,
// the reservation released and the agent's server retired.

import { BASE, apiSession, axeCheck, expect, fakeAgent, operator, run, shot, signIn, signOut, sshPublicKey, step, tenant } from "./lib.mjs";

const POLL_MS = 3000; // the reservation page's polling interval
const IDLE_HOST = `e2e-idle-${Date.now().toString(36)}`;
const IDLE_GPU = `GPU-${IDLE_HOST}-0`;
// The reclaimer judges whole minutes inside the allocation: the warning comes 5 to 7 minutes after the booking.
const IDLE_TIMEOUT_MS = Number(process.env.IDLE_TIMEOUT_S ?? 600) * 1000;

/** The operator enrolls the idle agent, puts its server in service and gives the demo project an idle policy;
 * the tenant books the idle GPU for two hours. Returns what the banner step and the clean-up need. */
async function idleSetup() {
  const ops = await apiSession(operator);
  const api = await apiSession(tenant);
  const made = { ops, api, agent: null, serverId: null, reservation: null, policy: null };
  const token = await ops("POST", "join-tokens/", { note: `e2e ${IDLE_HOST}`, ttl_s: 600 });
  expect(token.status === 201, `a join token for the idle agent: ${token.status} ${JSON.stringify(token.data)}`);
  made.agent = await fakeAgent(token.data.token, {
    hostname: IDLE_HOST,
    gpu: { uuid: IDLE_GPU, index: 0, name: "AMD Instinct MI250X", memory_total_mib: 65536, vendor: "amd" },
    fields: { DCGM_FI_DEV_GPU_UTIL: 0, DCGM_FI_DEV_GPU_TEMP: 40, DCGM_FI_DEV_POWER_USAGE: 90 },
  });
  await made.agent.beat(); // the first heartbeat makes the GPU known
  made.agent.every(3000);
  const servers = await ops("GET", "servers/?limit=500");
  const server = servers.data.results.find((s) => s.hostname === IDLE_HOST);
  expect(server, `the idle agent's server is listed: ${IDLE_HOST}`);
  made.serverId = server.id;
  if (server.state !== "ready") {
    const ready = await ops("POST", `servers/${server.id}/state/`, { state: "ready", reason: "e2e: the idle GPU's server" });
    expect(ready.status === 200, `the idle agent's server is ready: ${ready.status} ${JSON.stringify(ready.data)}`);
  }
  const before = await ops("GET", "ledger/quotas/demo/");
  expect(before.status === 200, `the demo project's quota policy: ${before.status}`);
  made.policy = {
    idle_util_percent: before.data.idle_util_percent,
    idle_minutes: before.data.idle_minutes,
    idle_grace_minutes: before.data.idle_grace_minutes,
  };
  const policy = await ops("PATCH", "ledger/quotas/demo/", { idle_util_percent: "5", idle_minutes: 5, idle_grace_minutes: 10 });
  expect(policy.status === 200, `an idle policy for demo: ${policy.status} ${JSON.stringify(policy.data)}`);
  const start = new Date();
  const booking = await api("POST", "reservations/", {
    project: "demo",
    name: "e2e idle",
    spec: { gpu_model: "MI250X", gpu_count: 1 },
    window: { start: "now", end: new Date(start.getTime() + 2 * 3_600_000).toISOString() },
    container: { image: "gpucp-busybox:test", command: ["sleep", "7200"], env: {} },
  });
  expect(booking.status === 201, `the idle GPU is booked: ${booking.status} ${JSON.stringify(booking.data)}`);
  made.reservation = booking.data.id;
  console.log(`e2e | idle reservation ${made.reservation} booked on ${IDLE_HOST}; the warning is due in 5 to 7 minutes`);
  return made;
}

async function idleCleanup(made) {
  if (!made) return;
  const { ops, api } = made;
  const quietly = (what, promise) => promise.catch((e) => console.log(`e2e | clean-up ${what}: ${e}`));
  if (made.reservation) {
    const r = await quietly("read", api("GET", `reservations/${made.reservation}/`));
    const state = r?.data?.state;
    if (["pending", "scheduled"].includes(state)) await quietly("cancel", api("POST", `reservations/${made.reservation}/cancel/`, { reason: "e2e: done" }));
    if (["starting", "running"].includes(state)) await quietly("release", api("POST", `reservations/${made.reservation}/release/`, { reason: "e2e: done" }));
    // The agent reports the container stopped, as a real one would, before it goes.
    for (let i = 0; i < 5 && made.agent; i++) {
      await quietly("heartbeat", made.agent.beat());
      const now = await quietly("read", api("GET", `reservations/${made.reservation}/`));
      if (!["starting", "running", "stopping"].includes(now?.data?.state)) break;
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
  made.agent?.stop();
  if (made.policy) await quietly("policy", ops("PATCH", "ledger/quotas/demo/", made.policy));
  if (made.serverId) await quietly("retire", ops("POST", `servers/${made.serverId}/state/`, { state: "retired", reason: "e2e: idle agent done" }));
}

/** The warning as the reservation's API gives it, once the reclaimer has made it. */
async function waitForIdleWarning(api, id) {
  const deadline = Date.now() + IDLE_TIMEOUT_MS;
  let last = null;
  while (Date.now() < deadline) {
    const r = await api("GET", `reservations/${id}/idle/`);
    last = r.data?.idle;
    if (last?.state === "warned") return last;
    const state = (await api("GET", `reservations/${id}/`)).data?.state;
    expect(["scheduled", "starting", "running"].includes(state), `the idle reservation is still live while it waits: ${state}`);
    await new Promise((r) => setTimeout(r, 5000));
  }
  throw new Error(`no idle warning for ${id} in ${IDLE_TIMEOUT_MS / 1000}s (last: ${JSON.stringify(last)})`);
}

async function signInHere(page, who) {
  await page.getByLabel("Username").fill(who.user);
  await page.getByLabel("Password").fill(who.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByTestId("signed-in-as").waitFor();
}

/** The focused element's focus indicator, as computed: a non-zero outline or a box shadow. */
async function focusRing(page) {
  return page.evaluate(() => {
    const el = document.activeElement;
    // A PasswordInput's real <input> sits inside the framed element that draws the ring.
    const frame = el.closest(".mantine-Input-input") ?? el;
    const s = getComputedStyle(frame);
    return { tag: el.tagName, outline: `${s.outlineStyle} ${s.outlineWidth}`, width: parseFloat(s.outlineWidth), style: s.outlineStyle, shadow: s.boxShadow };
  });
}

await run("a11y", async (page, context) => {
  let idle = null;
  try {
    step("idle reclamation: an agent reports an MI250X at 0 %; demo gets an idle policy; the tenant books the GPU");
    idle = await idleSetup();
    await walk(page, context);
    await idleBanner(page, idle);
  } finally {
    await idleCleanup(idle);
  }
});

async function idleBanner(page, idle) {
  step("the idle warning's banner on the reservation page passes axe, and Keep it keeps the reservation");
  const warning = await waitForIdleWarning(idle.api, idle.reservation);
  expect(Number(warning.util_percent) < 5, `the warning reports the GPU's utilization: ${JSON.stringify(warning)}`);
  // Whoever the walk left signed in (the operator): wait until the portal shows either its header or the
  // sign-in form, as a check made before it has asked who is signed in reads "nobody".
  await page.goto(`${BASE}/`);
  const signedIn = page.getByTestId("signed-in-as");
  await signedIn.or(page.getByLabel("Username")).first().waitFor();
  if (await signedIn.isVisible()) await signOut(page);
  await signIn(page, tenant);
  await page.goto(`${BASE}/reservations/${idle.reservation}`);
  // Mantine's Alert names itself by its title (aria-labelledby), so it is found by its test id.
  const banner = page.getByTestId("idle-banner");
  await banner.waitFor();
  expect((await banner.innerText()).includes("This reservation looks idle"), "the banner says what it found");
  await axeCheck(page, "idle-banner");
  await shot(page, "a11y-idle-banner");
  await banner.getByRole("button", { name: "Keep it" }).click();
  await banner.waitFor({ state: "detached" });
  const kept = await idle.api("GET", `reservations/${idle.reservation}/idle/`);
  expect(kept.data?.idle?.state === "kept", `kept: ${JSON.stringify(kept.data)}`);
  const r = await idle.api("GET", `reservations/${idle.reservation}/`);
  expect(r.data.ends_at === warning.booked_ends_at || Date.parse(r.data.ends_at) === Date.parse(warning.booked_ends_at),
    `kept, it runs to its booked end: ${r.data.ends_at} vs ${warning.booked_ends_at}`);
}

async function walk(page, context) {
  step("a signed-out load asks whether it is signed in without an error: no 401, nothing red in the console");
  const consoleErrors = [];
  const unauthorized = [];
  const onConsole = (m) => { if (m.type() === "error") consoleErrors.push(m.text()); };
  const onResponse = (r) => { if (r.status() === 401) unauthorized.push(r.url()); };
  page.on("console", onConsole);
  page.on("response", onResponse);
  await page.goto(`${BASE}/usage?project=demo`);
  await page.waitForURL(/\/login\?next=/);
  await page.getByLabel("Username").waitFor();
  await page.waitForLoadState("networkidle");
  expect(unauthorized.length === 0, `no 401 on a signed-out load: ${unauthorized.join(", ")}`);
  expect(consoleErrors.length === 0, `no console error on a signed-out load: ${consoleErrors.join(" | ")}`);
  page.off("console", onConsole);
  page.off("response", onResponse);

  step("the password field shows a visible focus ring");
  await page.getByLabel("Password").focus();
  const pwRing = await focusRing(page);
  expect((pwRing.style !== "none" && pwRing.width >= 2) || pwRing.shadow !== "none", `focus is visible on the password field: ${JSON.stringify(pwRing)}`);

  step("sign-in returns to the page that was asked for, query and all");
  expect(new URL(page.url()).searchParams.get("next") === "/usage?project=demo", `next keeps the query: ${page.url()}`);
  await signInHere(page, tenant);
  await page.waitForURL((u) => u.pathname === "/usage" && u.search === "?project=demo");

  step("the first Tab reaches the skip link; Enter moves focus to the page's main content");
  await page.goto(`${BASE}/no-such-page`);
  await page.getByRole("heading", { level: 1, name: "Page not found" }).waitFor();
  await axeCheck(page, "not-found");
  await page.keyboard.press("Tab");
  const first = await page.evaluate(() => ({ text: document.activeElement?.textContent, href: document.activeElement?.getAttribute("href") }));
  expect(first.text === "Skip to main content", `the first Tab focuses the skip link: ${JSON.stringify(first)}`);
  expect(await page.getByRole("link", { name: "Skip to main content" }).isVisible(), "the focused skip link is visible");
  await page.keyboard.press("Enter");
  const afterSkip = await page.evaluate(() => ({ tag: document.activeElement?.tagName, id: document.activeElement?.id }));
  expect(afterSkip.tag === "MAIN" && afterSkip.id === "main", `Enter on the skip link focuses main: ${JSON.stringify(afterSkip)}`);
  await page.keyboard.press("Tab");
  const inMain = await page.evaluate(() => ({ inMain: Boolean(document.activeElement?.closest("main")), text: document.activeElement?.textContent }));
  expect(inMain.inMain, `the next Tab after the skip link is in the main content: ${JSON.stringify(inMain)}`);

  step("the header's product name is not a heading: the page's own title is the one h1");
  const h1s = await page.getByRole("heading", { level: 1 }).allInnerTexts();
  expect(h1s.length === 1 && h1s[0] === "Page not found", `one h1, the page's own: ${JSON.stringify(h1s)}`);
  expect((await page.getByRole("heading", { name: "GPU control plane" }).count()) === 0, "the header's name is no heading");

  step("a text input shows a visible focus ring");
  await page.goto(`${BASE}/tokens`);
  await page.getByLabel("Name").focus();
  const ring = await focusRing(page);
  expect((ring.style !== "none" && ring.width >= 2) || ring.shadow !== "none", `focus is visible on a text input: ${JSON.stringify(ring)}`);

  step("a modal's close button is named (SSH key deletion)");
  await page.goto(`${BASE}/ssh-keys`);
  const keyForm = page.getByRole("form", { name: "New SSH key" });
  await keyForm.waitFor();
  await keyForm.getByLabel("Name").fill("a11y key");
  await keyForm.getByLabel("Public key").fill(sshPublicKey("a11y@portal"));
  await page.getByRole("button", { name: "Add key" }).click();
  await page.getByTestId("added-key").waitFor();
  await page.getByRole("button", { name: "Delete key a11y key" }).click();
  const dialog = page.getByRole("dialog");
  await dialog.waitFor();
  await dialog.getByRole("button", { name: "Close" }).waitFor();
  await axeCheck(page, "ssh-key-delete-dialog");
  await dialog.getByRole("button", { name: "Close" }).click();
  await dialog.waitFor({ state: "hidden" });
  await page.getByRole("button", { name: "Delete key a11y key" }).click();
  await page.getByRole("button", { name: "Delete key", exact: true }).click();
  await page.getByRole("button", { name: "Delete key a11y key" }).waitFor({ state: "detached" });

  step("an unknown reservation is asked for once: a 404 is neither retried nor polled");
  const unknown = "00000000-0000-4000-8000-000000000000";
  const asked = [];
  const onRequest = (r) => { if (new URL(r.url()).pathname === `/api/v1/reservations/${unknown}/`) asked.push(r.method()); };
  page.on("request", onRequest);
  await page.goto(`${BASE}/reservations/${unknown}`);
  await page.getByRole("alert").waitFor();
  await page.waitForTimeout(2 * POLL_MS + 1000);
  page.off("request", onRequest);
  expect(asked.length === 1, `the unknown reservation was asked for once, not ${asked.length} times`);
  await axeCheck(page, "reservation-not-found");

  step("sign-in refuses to send anyone to another site");
  await signOut(page);
  for (const next of ["https://evil.example/", "//evil.example/", "/\\evil.example"]) {
    await page.goto(`${BASE}/login?next=${encodeURIComponent(next)}`);
    await signInHere(page, tenant);
    await page.waitForURL((u) => u.origin === new URL(BASE).origin && u.pathname === "/");
    await signOut(page);
  }

  step("the operator's modal close button is named too (drain dialog), and closing it drains nothing");
  await page.goto(`${BASE}/fleet`);
  await page.waitForURL(/\/login/);
  await signInHere(page, operator);
  await page.waitForURL(/\/fleet$/);
  await page.getByTestId("heatmap").waitFor();
  const row = page.locator('[data-testid^="server-"]').filter({ has: page.getByRole("button", { name: "Drain" }) }).first();
  await row.getByRole("button", { name: "Drain" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Close" }).click();
  await page.getByRole("dialog").waitFor({ state: "hidden" });
  await row.getByRole("button", { name: "Drain" }).waitFor();

  step("the API docs render offline: Swagger UI lists the operations with every external request blocked");
  const blocked = [];
  const origin = new URL(BASE).origin;
  await context.route("**/*", (route) => {
    if (new URL(route.request().url()).origin === origin) return route.continue();
    blocked.push(route.request().url());
    return route.abort();
  });
  await page.goto(`${BASE}/api/v1/docs/`);
  await page.locator(".opblock").first().waitFor({ timeout: 30_000 });
  // Swagger UI virtualises a long operation list (only what is near the viewport is in the page): scroll
  // through it and collect every operation it draws, then compare with the schema's own list.
  const schema = await (await page.request.get(`${BASE}/api/v1/schema/?format=json`)).json();
  const expected = new Set();
  for (const [path, ops] of Object.entries(schema.paths))
    for (const method of Object.keys(ops)) if (method !== "parameters") expected.add(`${method.toUpperCase()} ${path}`);
  const seen = new Set();
  for (let stalls = 0; stalls < 3; ) {
    const batch = await page.evaluate(() =>
      [...document.querySelectorAll(".opblock-summary")].map(
        (el) => `${el.querySelector(".opblock-summary-method")?.textContent} ${el.querySelector(".opblock-summary-path")?.getAttribute("data-path")}`,
      ),
    );
    const before = seen.size;
    batch.forEach((op) => seen.add(op));
    const atEnd = await page.evaluate(() => {
      window.scrollBy(0, window.innerHeight * 0.8);
      return window.innerHeight + window.scrollY >= document.body.scrollHeight - 2;
    });
    stalls = atEnd && seen.size === before ? stalls + 1 : 0;
    await page.waitForTimeout(100);
  }
  const missing = [...expected].filter((op) => !seen.has(op));
  expect(missing.length === 0, `Swagger UI lists every operation of the schema (${seen.size} of ${expected.size}; missing ${missing.slice(0, 5).join(", ")})`);
  const operations = seen.size;
  console.log(`e2e | swagger: ${operations} operations; external requests blocked: ${blocked.length ? blocked.join(", ") : "none made"}`);
  await context.unroute("**/*");
}
