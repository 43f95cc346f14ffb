// The operator's portal, each finding of issue 12 in turn, in Europe/Berlin: join tokens (the Copy button copies
// the whole agent command), GPU faults (an XID reported by an agent enrolled with that command, explained and
// acknowledged with a reason; the temperature behind "temperature"), who holds each GPU, the warning before a
// server with unhealthy GPUs returns to ready, the reservations a drain leaves in place, readable heatmap colours,
// tooltips on keyboard focus, the accounting console, the operator's project picker; then the tenant's usage page
// (zone named, provisional figures, hold -> release -> charge in words, a chart with more than one point).
//
// It leaves the demo system as it found it: the tenant's reservations are released, the drained server is back
// to ready and the agent it enrolled is retired.

import { BASE, DESKTOP, PHONE, apiSession as signedInSession, axeCheck, expect, fakeAgent, operator, run, shot, signIn, signOut, step, tenant } from "./lib.mjs";

const START_TIMEOUT_MS = Number(process.env.START_TIMEOUT_S ?? 150) * 1000;
const FAULTY = `e2e-faulty-${Date.now().toString(36)}`;
const FAULTY_GPU = `GPU-${FAULTY}-0`;
const HOT_C = 96;
const PHONE_NOTE = `e2e phone ${FAULTY}`;

/** lib.mjs's signed-in API session, answering a call's body and throwing on an error status. */
async function apiSession(who) {
  const send = await signedInSession(who);
  const call = async (method, path, data) => {
    const res = await send(method, path, method === "GET" ? undefined : (data ?? {}));
    if (res.status >= 400) throw new Error(`${method} /api/v1/${path}: HTTP ${res.status} ${JSON.stringify(res.data)}`);
    return res.data;
  };
  return { call, dispose: async () => {} };
}

async function waitForState(api, id, wanted, timeoutMs = START_TIMEOUT_MS) {
  const deadline = Date.now() + timeoutMs;
  let state = "";
  while (Date.now() < deadline) {
    state = (await api.call("GET", `reservations/${id}/`)).state;
    if (wanted.includes(state)) return state;
    await new Promise((r) => setTimeout(r, 2000));
  }
  throw new Error(`reservation ${id} did not reach ${wanted.join("/")} (last: ${state})`);
}

async function book(api, name, gpuModel, command = ["sleep", "3600"], startInMin = 0) {
  const start = startInMin ? new Date(Date.now() + startInMin * 60_000).toISOString() : "now";
  const end = new Date(Date.now() + (startInMin + 60) * 60_000).toISOString();
  return api.call("POST", "reservations/", {
    project: "demo",
    name,
    spec: { gpu_model: gpuModel, gpu_count: 1 },
    window: { start, end },
    // The image's own command exits at once: sleep says how long the container runs.
    container: { image: "gpucp-busybox:test", command, env: {} },
  });
}

/** A booking that holds its GPU now (running, or on its way there). */
async function bookHeld(api, name, booked) {
  const r = await book(api, name, "H100-80GB");
  booked.push(r.id);
  await waitForState(api, r.id, ["running", "starting", "scheduled"]);
  return r;
}

async function endReservation(api, id) {
  const r = await api.call("GET", `reservations/${id}/`);
  if (["pending", "scheduled"].includes(r.state)) await api.call("POST", `reservations/${id}/cancel/`, { reason: "e2e: done" });
  else if (["starting", "running"].includes(r.state)) await api.call("POST", `reservations/${id}/release/`, { reason: "e2e: done" });
}

/**
 * At phone width: every row of the table is a card, each labelled cell named by its column's header and inside
 * the screen, nothing cut; and the page as a whole does not scroll sideways.
 */
async function expectCards(page, table, what) {
  await table.locator("tbody > tr").first().waitFor();
  const found = await table.evaluate((t, width) => {
    const heads = [...t.querySelectorAll("thead th")].map((th) => th.textContent.trim());
    const rows = [...t.querySelectorAll("tbody > tr")];
    const problems = [];
    let labelled = 0;
    for (const tr of rows) {
      if (getComputedStyle(tr).display !== "block") problems.push(`a row is shown as ${getComputedStyle(tr).display}`);
      [...tr.children].forEach((td, i) => {
        const label = td.dataset.label;
        if (label !== undefined) {
          labelled++;
          if (label !== heads[i]) problems.push(`cell ${i} is labelled "${label}", its column "${heads[i]}"`);
        }
        const box = td.getBoundingClientRect();
        if (box.left < 0 || box.right > width + 1) problems.push(`"${label}" runs off the screen (${Math.round(box.left)}..${Math.round(box.right)})`);
        if (td.scrollWidth > td.clientWidth + 1) problems.push(`"${label}" is cut (${td.scrollWidth} > ${td.clientWidth})`);
      });
    }
    return { rows: rows.length, labelled, problems: problems.slice(0, 5), pageWidth: document.documentElement.scrollWidth };
  }, PHONE.width);
  expect(found.rows > 0 && found.labelled > 0 && found.problems.length === 0, `${what} as cards: ${JSON.stringify(found)}`);
  expect(found.pageWidth <= PHONE.width, `${what}: the page is ${found.pageWidth}px wide on a ${PHONE.width}px screen`);
}

/** Choose a segment of a SegmentedControl by its label, as a pointer does. */
const pick = (scope, name) => scope.locator("label").filter({ hasText: new RegExp(`^${name}$`) }).click();

const number = (text) => Number(text.replace(/[^0-9.-]/g, ""));

run(
  "operator",
  async (page, context) => {
    const tenantApi = await apiSession(tenant);
    const opApi = await apiSession(operator);
    let agent = null;
    const booked = [];
    let drained = null;
    try {
      step("the tenant books two GPUs by the API: one that finishes by itself (charged), one that keeps running");
      // On different servers, so that ending one leaves the other running.
      const done = await book(tenantApi, "e2e-ops-done", "A100-40GB", ["sleep", "20"]);
      booked.push(done.id);
      await waitForState(tenantApi, done.id, ["running", "ending", "completed", "failed"]);
      const held = await bookHeld(tenantApi, "e2e-ops-held", booked);

      // --- join tokens ---------------------------------------------------------------------------------
      step("join tokens: the Copy button copies the whole agent command");
      await signIn(page, operator);
      await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: BASE });
      await page.getByRole("link", { name: "Join tokens" }).click();
      await page.getByRole("heading", { level: 1, name: "Join tokens" }).waitFor();
      await page.getByLabel("Note").fill(`e2e ${FAULTY}`);
      await page.getByRole("button", { name: "Create join token" }).click();
      const command = (await page.getByTestId("agent-command").innerText()).trim();
      expect(/^python -m nodeagent run --server http\S+ --join-token \S+$/.test(command), `the command shown: ${command}`);
      await page.getByRole("button", { name: "Copy command" }).click();
      await page.getByRole("button", { name: "Copied the command" }).waitFor();
      let copied;
      try {
        copied = await page.evaluate(() => navigator.clipboard.readText());
      } catch (e) {
        console.log(`e2e | clipboard not readable here (${e}); checking the value the button copies`);
        copied = await page.getByRole("button", { name: "Copied the command" }).getAttribute("data-copy-value");
      }
      expect(copied === command, `copied the whole command, not only the token: ${JSON.stringify(copied)}`);
      await axeCheck(page, "join-tokens");
      await shot(page, "op-01-join-token");

      step("an agent enrolled with that command reports XID 79 and a GPU at 96 °C");
      const token = command.split("--join-token ")[1];
      agent = await fakeAgent(token, {
        hostname: FAULTY,
        gpu: { uuid: FAULTY_GPU, index: 0, name: "NVIDIA H100 80GB HBM3", memory_total_mib: 81559 },
        fields: { DCGM_FI_DEV_GPU_UTIL: 0, DCGM_FI_DEV_GPU_TEMP: HOT_C },
      });
      await agent.beat(); // the first heartbeat makes the GPU known; the XID comes in the next
      await agent.beat([{ kind: "xid", ts: new Date().toISOString(), uuid: FAULTY_GPU, xid: 79 }]);
      // Keep it reporting (without the XID again), as a live agent does, so it stays out of "offline".
      agent.every(3000);

      // --- fleet health -------------------------------------------------------------------------------
      step("fleet: the XID is explained in a line and the temperature value is shown");
      await page.getByRole("link", { name: "Fleet health" }).click();
      await page.getByRole("heading", { level: 1, name: "Fleet health" }).waitFor();
      const health = page.getByTestId(`health-${FAULTY}-0`);
      await health.getByText("needs acknowledgement").waitFor();
      const healthText = await health.innerText();
      expect(healthText.includes("XID 79: GPU has fallen off the bus"), `XID explained: ${healthText}`);
      expect(healthText.includes(`temperature: ${HOT_C} °C now`), `temperature value shown: ${healthText}`);
      await shot(page, "op-02-fleet-fault");

      step("fleet: the tenant and reservation are shown on a GPU in use");
      const inUse = page.getByTestId("gpus-in-use");
      await inUse.getByText("e2e-ops-held").waitFor();
      const inUseRow = inUse.getByRole("row").filter({ hasText: "e2e-ops-held" });
      expect((await inUseRow.innerText()).includes("(demo)"), `the tenant's project is named: ${await inUseRow.innerText()}`);

      step("fleet: GPU tooltips open on keyboard focus, and name the holder");
      const detail = await tenantApi.call("GET", `reservations/${held.id}/`);
      const heldGpu = detail.allocations[0];
      const cells = page.locator('[data-testid^="heat-"]');
      const target = page.getByTestId(`heat-${heldGpu.gpu}`);
      const index = await cells.evaluateAll((els, id) => els.findIndex((el) => el.dataset.testid === id), `heat-${heldGpu.gpu}`);
      expect(index > 0, `the held GPU's cell is in the heatmap (${index})`);
      await cells.nth(index - 1).focus();
      await page.keyboard.press("Tab");
      expect(await target.evaluate((el) => el === document.activeElement), "Tab moved the focus to the next GPU");
      const tip = page.getByRole("tooltip").filter({ hasText: `GPU ${heldGpu.index}` });
      await tip.waitFor();
      expect((await tip.innerText()).includes("held by demo"), `the tooltip names the holder: ${await tip.innerText()}`);
      await page.keyboard.press("Tab");

      step("fleet: every heatmap cell's text reads at 4.5:1 or better");
      const ratios = await cells.evaluateAll((els) => {
        const rgb = (s) => (s.match(/[\d.]+/g) ?? []).slice(0, 3).map(Number);
        const lum = ([r, g, b]) => {
          const f = (c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
          return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
        };
        return els.map((el) => {
          const st = getComputedStyle(el);
          const [a, b] = [lum(rgb(st.backgroundColor)), lum(rgb(st.color))].sort((x, y) => y - x);
          return (a + 0.05) / (b + 0.05);
        });
      });
      expect(ratios.length > 10 && Math.min(...ratios) >= 4.5, `heatmap contrast: lowest ${Math.min(...ratios).toFixed(2)}`);
      await pick(page, "Temperature");
      await axeCheck(page, "fleet");
      await pick(page, "Utilization");
      await shot(page, "op-03-fleet");

      step("fleet: the XID is acknowledged with a reason");
      await page.getByRole("button", { name: `Acknowledge ${FAULTY} GPU 0` }).click();
      const ackDialog = page.getByRole("dialog");
      await ackDialog.getByText("XID 79: GPU has fallen off the bus").waitFor();
      await ackDialog.getByLabel("Reason").fill("e2e: reseated the GPU");
      await ackDialog.getByRole("button", { name: "Acknowledge" }).click();
      await ackDialog.waitFor({ state: "hidden" });
      await health.getByText("needs acknowledgement").waitFor({ state: "detached" });
      expect(!(await health.innerText()).includes("XID 79"), "the XID is cleared; the temperature stays");
      const server = (await opApi.call("GET", `servers/?limit=500`)).results.find((s) => s.hostname === FAULTY);
      const events = (await opApi.call("GET", `servers/${server.id}/events/`)).results;
      const ack = events.find((e) => e.kind === "gpu_acknowledged");
      expect(ack && ack.reason === "e2e: reseated the GPU" && ack.actor_label === operator.user, `acknowledged by the operator with the reason: ${JSON.stringify(ack)}`);

      step("fleet: returning a server with unhealthy GPUs to ready is warned about first");
      await page.getByTestId(`server-${FAULTY}`).getByRole("button", { name: "Return to ready" }).click();
      const readyDialog = page.getByRole("dialog");
      const warning = readyDialog.getByTestId("unhealthy-warning");
      await warning.waitFor();
      expect((await warning.innerText()).includes(`${HOT_C} °C`), `the warning names the fault: ${await warning.innerText()}`);
      await readyDialog.getByLabel("Reason").fill("e2e: not yet");
      expect(await readyDialog.getByRole("button", { name: "Return to ready" }).isDisabled(), "not without confirming");
      await readyDialog.getByLabel("Return it to ready anyway").check();
      expect(await readyDialog.getByRole("button", { name: "Return to ready" }).isEnabled(), "enabled once confirmed");
      await axeCheck(page, "fleet-ready-warning");
      await shot(page, "op-04-ready-warning");
      await page.keyboard.press("Escape");
      await readyDialog.waitFor({ state: "hidden" });

      step("fleet: draining lists the reservations affected first; the server then returns to ready");
      const host = heldGpu.server;
      await page.getByTestId(`server-${host}`).getByRole("button", { name: "Drain" }).click();
      const drainDialog = page.getByRole("dialog");
      const affected = drainDialog.getByTestId("drain-affected");
      await affected.getByText("e2e-ops-held").waitFor();
      expect((await affected.innerText()).includes("Reservations affected"), `affected listed: ${await affected.innerText()}`);
      await axeCheck(page, "fleet-drain");
      await shot(page, "op-05-drain-preview");
      await drainDialog.getByLabel("Reason").fill("e2e: firmware update");
      await drainDialog.getByRole("button", { name: "Drain" }).click();
      drained = host;
      await page.getByTestId(`server-${host}`).getByText("draining").waitFor();
      await page.getByTestId(`server-${host}`).getByRole("button", { name: "Return to ready" }).click();
      await page.getByRole("dialog").getByLabel("Reason").fill("e2e: done");
      await page.getByRole("dialog").getByRole("button", { name: "Return to ready" }).click();
      await page.getByTestId(`server-${host}`).getByText("ready", { exact: true }).waitFor();
      drained = null;

      // --- accounting ---------------------------------------------------------------------------------
      step("the finished reservation is settled (hold released, charge taken)");
      // Its container exits by itself after 20 s, and the reservation completes.
      const charged = async () => {
        const entries = (await opApi.call("GET", `ledger/entries/?reservation=${done.id}&limit=50`)).results;
        return entries.find((e) => e.kind === "charge" && Number(e.amount) < 0);
      };
      const settleBy = Date.now() + 90_000;
      while (!(await charged()) && Date.now() < settleBy) await new Promise((r) => setTimeout(r, 1000));
      const charge = await charged();
      expect(charge, "the finished reservation was charged");

      // A booking for later holds its credits until it ends, whatever becomes of the running ones.
      const later = await book(tenantApi, "e2e-ops-later", "H100-80GB", ["sleep", "3600"], 120);
      booked.push(later.id);

      step("accounting console: balance and holds of a project");
      await page.getByRole("link", { name: "Accounting" }).click();
      await page.getByRole("heading", { level: 1, name: "Accounting" }).waitFor();
      await page.getByRole("textbox", { name: "Project" }).click();
      await page.getByRole("option", { name: /\(demo\)$/ }).click();
      const balance = page.getByTestId("balance");
      await balance.waitFor();
      const before = number(await balance.innerText());
      await page.getByTestId("accounting-holds").getByText(later.id.slice(0, 8)).waitFor();
      expect(number(await page.getByTestId("held").innerText()) > 0, "credits held for the booked reservations");

      step("accounting console: a grant with a reason");
      const form = page.getByRole("form", { name: "Grant, adjust or refund credits" });
      await form.getByLabel("Amount (credits)").fill("10");
      await form.getByLabel("Reason").fill("e2e grant");
      await form.getByRole("button", { name: "Record grant" }).click();
      await page.getByTestId("move-recorded").getByText("by user:operator").waitFor();
      await page.waitForFunction((b) => Number(document.querySelector('[data-testid="balance"]').textContent.replace(/[^0-9.-]/g, "")) >= b + 10 - 0.01, before);

      step("accounting console: an adjustment with a reason; bad input is named");
      await pick(form, "Adjustment");
      await form.getByLabel("Amount (credits)").fill("0");
      await form.getByLabel("Reason").fill("e2e nothing");
      await form.getByRole("button", { name: "Record adjustment" }).click();
      await form.getByText(/zero/i).first().waitFor();
      await form.getByLabel("Amount (credits)").fill("-2.5");
      await form.getByLabel("Reason").fill("e2e adjustment");
      await form.getByRole("button", { name: "Record adjustment" }).click();
      await page.getByTestId("move-recorded").getByText("e2e adjustment").waitFor();

      step("accounting console: a refund for the charged reservation, with a reason");
      await pick(form, "Refund");
      await form.getByRole("textbox", { name: "Reservation" }).click();
      await page.getByRole("option", { name: done.id }).click();
      const refund = Math.min(0.0001 * Math.floor(-Number(charge.amount) / 0.0001), 0.001).toFixed(4);
      await form.getByLabel("Amount (credits)").fill(refund);
      await form.getByLabel("Reason").fill("e2e refund");
      await form.getByRole("button", { name: "Record refund" }).click();
      await page.getByTestId("move-recorded").getByText("e2e refund").waitFor();

      step("accounting console: the ledger shows the three entries with the operator as actor");
      const ledger = page.getByTestId("ledger-entries");
      for (const [kind, reason] of [["grant", "e2e grant"], ["adjust", "e2e adjustment"], ["refund", "e2e refund"]]) {
        const row = ledger.getByRole("row").filter({ hasText: reason }).first();
        await row.waitFor();
        const text = await row.innerText();
        expect(text.includes(kind) && text.includes("user:operator"), `${kind} entry by the operator: ${text}`);
      }
      expect((await page.getByTestId("accounting-usage").innerText()).includes("e2e-ops"), "usage of the project is shown");
      await axeCheck(page, "accounting");
      await shot(page, "op-06-accounting");

      step("the operator's usage page lists projects to pick");
      await page.getByRole("link", { name: "Usage" }).click();
      await page.getByRole("heading", { level: 1, name: "Usage" }).waitFor();
      await page.getByRole("textbox", { name: "Project" }).click();
      const options = page.getByRole("option");
      await options.first().waitFor();
      expect((await options.count()) >= 1 && (await page.getByRole("option", { name: /\(demo\)$/ }).count()) === 1, "projects listed");
      await page.getByRole("option", { name: /\(demo\)$/ }).click();
      await page.getByTestId("usage-totals").waitFor();
      await axeCheck(page, "usage-operator");

      // --- phone ----------------------------------------------------------------------------------------
      step("on a phone the usage report's rows are cards, nothing wider than the screen");
      await page.setViewportSize(PHONE);
      await expectCards(page, page.getByTestId("usage-rows"), "the usage report");
      await axeCheck(page, "usage-phone");
      await shot(page, "op-08-usage-phone");

      step("on a phone the join tokens are cards and the Copy command button is whole");
      await page.goto(`${BASE}/join-tokens`);
      await page.getByRole("heading", { level: 1, name: "Join tokens" }).waitFor();
      await page.getByLabel("Note").fill(PHONE_NOTE);
      await page.getByRole("button", { name: "Create join token" }).click();
      const copyCommand = page.getByRole("button", { name: "Copy command" });
      await copyCommand.waitFor();
      const copyFits = await copyCommand.evaluate((el) => ({ scroll: el.scrollWidth, client: el.clientWidth, right: el.getBoundingClientRect().right }));
      expect(copyFits.scroll <= copyFits.client && copyFits.right <= PHONE.width, `the Copy command button is whole: ${JSON.stringify(copyFits)}`);
      const commandFits = await page.getByTestId("agent-command").evaluate((el) => ({ scroll: el.scrollWidth, client: el.clientWidth }));
      expect(commandFits.scroll <= commandFits.client + 1, `the command wraps instead of being cut: ${JSON.stringify(commandFits)}`);
      const tokensTable = page.getByTestId("join-tokens");
      await tokensTable.getByText(PHONE_NOTE).waitFor();
      await expectCards(page, tokensTable, "the join tokens");
      await axeCheck(page, "join-tokens-phone");
      await shot(page, "op-09-join-tokens-phone");
      const phoneTokenRow = tokensTable.getByRole("row").filter({ hasText: PHONE_NOTE });
      await phoneTokenRow.getByRole("button", { name: "Revoke" }).click();
      await phoneTokenRow.getByText("revoked").waitFor();

      step("on a phone the fleet's GPUs in use are cards");
      await page.goto(`${BASE}/fleet`);
      await page.getByRole("heading", { level: 1, name: "Fleet health" }).waitFor();
      await page.getByTestId("gpus-in-use").getByText("e2e-ops-held").waitFor();
      await expectCards(page, page.getByTestId("gpus-in-use"), "the GPUs in use");
      await axeCheck(page, "fleet-phone");
      await shot(page, "op-10-fleet-phone");

      step("on a phone the accounting ledger is cards");
      await page.goto(`${BASE}/accounting`);
      await page.getByRole("heading", { level: 1, name: "Accounting" }).waitFor();
      await page.getByRole("textbox", { name: "Project" }).click();
      await page.getByRole("option", { name: /\(demo\)$/ }).click();
      await page.getByTestId("ledger-entries").getByText("e2e refund").first().waitFor();
      await expectCards(page, page.getByTestId("ledger-entries"), "the accounting ledger");
      await axeCheck(page, "accounting-phone");
      await shot(page, "op-11-accounting-phone");
      await page.setViewportSize(DESKTOP);

      await signOut(page);

      // --- the tenant's usage page ----------------------------------------------------------------------
      // Booked just now: running (or starting), so it is in the report with its figures so far.
      const live = await bookHeld(tenantApi, "e2e-ops-live", booked);

      step("tenant usage: the zone is named, a running reservation is provisional");
      await signIn(page, tenant);
      await page.getByRole("link", { name: "Usage" }).click();
      await page.getByRole("heading", { level: 1, name: "Usage" }).waitFor();
      expect((await page.getByTestId("zone-note").innerText()).includes("Europe/Berlin"), "the browser's zone is named");
      await page.getByTestId("ledger-entries").getByRole("columnheader", { name: "When (Europe/Berlin)" }).waitFor(); // ledger times name it
      await pick(page, "Reservation");
      const heldRow = page.getByTestId(`usage-row-${live.id}`);
      await heldRow.waitFor();
      expect((await heldRow.getByTestId("provisional").count()) === 1, "the running reservation is labelled provisional");
      await page.getByTestId("provisional-note").waitFor();

      step("tenant usage: hold -> release -> charge is explained in plain words");
      const explained = await page.getByTestId("ledger-explained").innerText();
      expect(/holds[\s\S]*released[\s\S]*charge/.test(explained), `explained: ${explained.slice(0, 200)}`);
      expect(explained.includes("released in full"), `the settled reservation is explained: ${explained.slice(0, 400)}`);

      step("tenant usage: a chart per reservation with more than one point");
      const chart = page.getByTestId("chart-reservations");
      await chart.waitFor();
      expect(Number(await chart.getAttribute("data-points")) >= 2, `points: ${await chart.getAttribute("data-points")}`);
      expect((await chart.locator(".recharts-bar-rectangle").count()) >= 2, "bars drawn");
      await axeCheck(page, "usage-tenant");
      await shot(page, "op-07-usage-tenant");
    } finally {
      agent?.stop();
      await page.setViewportSize(DESKTOP).catch(() => {});
      const phoneTokens = (await opApi.call("GET", "join-tokens/?limit=200").catch(() => ({ results: [] }))).results;
      for (const t of phoneTokens.filter((x) => x.note === PHONE_NOTE && x.status === "active")) {
        await opApi.call("POST", `join-tokens/${t.id}/revoke/`).catch((e) => console.log(`e2e | revoke join token: ${e}`));
      }
      for (const id of booked) await endReservation(tenantApi, id).catch((e) => console.log(`e2e | cleanup ${id}: ${e}`));
      if (drained) {
        const s = (await opApi.call("GET", `servers/?limit=500`)).results.find((x) => x.hostname === drained);
        if (s && s.state === "draining") await opApi.call("POST", `servers/${s.id}/state/`, { state: "ready", reason: "e2e: cleanup" }).catch(() => {});
      }
      const faulty = (await opApi.call("GET", `servers/?limit=500`).catch(() => ({ results: [] }))).results.find((s) => s.hostname === FAULTY);
      if (faulty && faulty.state !== "retired") {
        await opApi.call("POST", `servers/${faulty.id}/state/`, { state: "retired", reason: "e2e: test agent done" }).catch((e) => console.log(`e2e | retire: ${e}`));
      }
      await tenantApi.dispose();
      await opApi.dispose();
    }
  },
  { timezoneId: "Europe/Berlin" },
);
