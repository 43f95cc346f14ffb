// Reservations, costs, history, charts and the phone layout (issue 12), in Europe/Berlin: books through the
// API as the tenant, then checks what the portal shows and asks. Cancels or releases everything it books.

import { join } from "node:path";

import { ARTIFACTS, BASE, PHONE, DESKTOP, axeCheck, expect, run, shot, signIn, step, tenant } from "./lib.mjs";

const START_TIMEOUT_MS = Number(process.env.START_TIMEOUT_S ?? 150) * 1000;
const booked = new Set();
// Names of this run's tokens: another run's may still be listed.
const tokenName = `e2e res token ${process.pid}`;
const phoneTokenName = `e2e phone token ${process.pid}`;

/** The API as the signed-in page: its session cookie and CSRF header. */
async function api(page, method, path, body) {
  return page.evaluate(
    async ({ method, path, body }) => {
      const cookie = () => document.cookie.split("; ").find((c) => c.startsWith("csrftoken="))?.split("=")[1];
      let csrf = cookie();
      if (!csrf && method !== "GET") {
        const r = await fetch("/api/v1/auth/csrf/", { credentials: "same-origin" });
        csrf = cookie() ?? (await r.json()).csrf_token;
      }
      const res = await fetch(`/api/v1/${path}`, {
        method,
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", ...(csrf ? { "X-CSRFToken": decodeURIComponent(csrf) } : {}) },
        body: body ? JSON.stringify(body) : undefined,
      });
      return { status: res.status, body: await res.json().catch(() => null) };
    },
    { method, path, body },
  );
}

async function book(page, name, { gpus, startInMin = 0, hours = 1 }) {
  const start = new Date(Date.now() + startInMin * 60_000);
  const end = new Date(start.getTime() + hours * 3_600_000);
  const res = await api(page, "POST", "reservations/", {
    project: "demo",
    name,
    spec: { min_memory_mib: 1000, gpu_count: gpus },
    window: { start: start.toISOString(), end: end.toISOString() },
    container: { image: "gpucp-busybox:test", command: ["sleep", "7200"], env: {} },
  });
  expect(res.status === 201, `booked ${name}: ${res.status} ${JSON.stringify(res.body)}`);
  booked.add(res.body.id);
  return res.body;
}

async function stateOf(page, id) {
  return (await api(page, "GET", `reservations/${id}/`)).body.state;
}

async function waitForBadge(page, states, timeout = START_TIMEOUT_MS) {
  await page.waitForFunction(
    (wanted) => {
      const b = document.querySelector('[data-testid="state-badge"]');
      return b && wanted.includes(b.textContent.trim().toLowerCase());
    },
    states,
    { timeout },
  );
}

/** The element's box lies inside the container's (1 px of slack), and inside the viewport's width. */
async function inside(inner, outer, viewportWidth) {
  const a = await inner.boundingBox();
  const b = await outer.boundingBox();
  expect(a && b, "both boxes are on screen");
  const ok = a.x >= b.x - 1 && a.y >= b.y - 1 && a.x + a.width <= b.x + b.width + 1 && a.y + a.height <= b.y + b.height + 1;
  return ok && (viewportWidth === undefined || a.x + a.width <= viewportWidth + 1);
}

/** Not cut: the element's text fits its box (no ellipsis, no clipping) and the box is inside the viewport. */
async function fullyShown(locator, viewportWidth) {
  const fits = await locator.evaluate((el) => el.scrollWidth <= el.clientWidth + 1);
  const box = await locator.boundingBox();
  return fits && box !== null && box.x >= 0 && box.x + box.width <= viewportWidth + 1;
}

await run(
  "reservations",
  async (page) => {
    try {
      await walk(page);
    } finally {
      // Leave the shared demo system as it was found: nothing of ours holds GPUs.
      for (const id of booked) {
        const state = await stateOf(page, id).catch(() => null);
        if (["scheduled", "pending"].includes(state)) await api(page, "POST", `reservations/${id}/cancel/`, { reason: "e2e cleanup" });
        if (["starting", "running"].includes(state)) await api(page, "POST", `reservations/${id}/release/`, { reason: "e2e cleanup" });
      }
    }
  },
  { timezoneId: "Europe/Berlin" },
);

async function walk(page) {
  step("the tenant books one reservation starting now and one for later, through the API");
  await signIn(page, tenant);
  const now = await book(page, "e2e cost now", { gpus: 2 });
  const later = await book(page, "e2e cost later", { gpus: 1, startInMin: 180 });
  const rate = Number(now.cost.credits_per_hour);
  expect(rate > 0, `the booking answer carries its rate: ${JSON.stringify(now.cost)}`);

  step("the dashboard shows the running reservation's credits/h and cost so far");
  await page.goto(`${BASE}/`);
  const row = page.getByTestId(`reservation-row-${now.id}`);
  await row.waitFor();
  await page.waitForFunction(
    (id) => {
      const r = document.querySelector(`[data-testid="reservation-row-${id}"]`);
      return r && r.closest("table")?.getAttribute("aria-label") === "Running reservations";
    },
    now.id,
    { timeout: START_TIMEOUT_MS },
  );
  const rowRate = await row.getByTestId("row-rate").innerText();
  expect(Number(rowRate) === rate, `the row's credits/h is the reservation's: ${rowRate} vs ${rate}`);
  expect(/credits$/.test(await row.getByTestId("row-cost").innerText()), "the row shows the cost so far");
  await axeCheck(page, "dashboard");

  step("the reservation page shows the rate and the running cost; its header's times refresh");
  await page.goto(`${BASE}/reservations/${now.id}`);
  await page.getByRole("heading", { level: 1, name: "e2e cost now" }).waitFor();
  await waitForBadge(page, ["running"]);
  const rateText = await page.getByTestId("cost-rate").innerText();
  expect(rateText === `${rate} credits/h`, `the page shows the rate: ${rateText}`);
  await page.getByTestId("cost-so-far").waitFor();
  const soFar = await page.getByTestId("cost-so-far").innerText();
  expect(/credits so far \(.+, [\d.]+ GPU-h\)/.test(soFar), `the page shows the running cost: ${soFar}`);
  const whenAtStart = await page.getByTestId("reservation-when").innerText();
  expect(/started (now|\d+ min ago), ends in/.test(whenAtStart), `the header says it started: ${whenAtStart}`);
  for (const held of await page.getByTestId("allocation-held").allInnerTexts()) {
    expect(held === "yes", `a running reservation's GPUs are held: ${held}`);
  }

  step("the telemetry charts: one line per GPU, drawn differently, memory in GiB, the tooltip rounded and inside the card");
  await page.waitForFunction(() => {
    const c = document.querySelector('[data-testid="telemetry-chart-memory"]');
    // A line is a path once it has two points.
    return c && c.querySelectorAll("path.recharts-line-curve").length >= 2;
  }, null, { timeout: 90_000 });
  const memory = page.getByTestId("telemetry-chart-memory");
  const series = (await memory.locator(".telemetry-chart").getAttribute("data-series")).split(",");
  expect(series.length === 2, `two GPUs, two series: ${series}`);
  const lines = await memory.locator("path.recharts-line-curve").evaluateAll((paths) =>
    paths.map((p) => `${p.getAttribute("stroke")}|${p.getAttribute("stroke-width")}|${p.getAttribute("stroke-dasharray") ?? ""}`),
  );
  expect(lines.length === 2 && new Set(lines).size === 2, `the two lines are drawn differently: ${lines.join(" ; ")}`);
  const widths = lines.map((l) => Number(l.split("|")[1]));
  expect(widths[0] !== widths[1], `one line is wider, so equal figures still show both: ${widths}`);
  const legend = await memory.locator(".recharts-legend-wrapper").innerText();
  expect(series.every((s) => legend.includes(s)), `the legend names both GPUs: ${legend}`);
  const ticks = await memory.locator(".recharts-yAxis .recharts-cartesian-axis-tick text").evaluateAll((texts) =>
    texts.map((t) => ({ text: t.textContent, lines: t.querySelectorAll("tspan").length })),
  );
  expect(ticks.length > 0 && ticks.every((t) => /GiB$/.test(t.text) && !/MiB/.test(t.text)), `the memory axis is in GiB: ${JSON.stringify(ticks)}`);
  expect(ticks.every((t) => t.lines <= 1), `no axis label wraps: ${JSON.stringify(ticks)}`);
  const card = page.locator('[data-testid="telemetry-charts"]').locator("xpath=ancestor::div[contains(@class,'mantine-Card-root')][1]");
  for (const key of ["power", "memory"]) {
    const chart = page.getByTestId(`telemetry-chart-${key}`);
    const wrapper = chart.locator(".recharts-wrapper").first();
    const tooltip = chart.locator(".recharts-tooltip-wrapper");
    await wrapper.scrollIntoViewIfNeeded();
    const box = await wrapper.boundingBox();
    // Towards the right edge, where a tooltip would run out of the card; moved until recharts shows it.
    let shown = false;
    for (let i = 0; i < 20 && !shown; i++) {
      await page.mouse.move(box.x + box.width * (0.6 + i / 60), box.y + box.height / 3, { steps: 3 });
      await page.waitForTimeout(150);
      shown = await tooltip.evaluate((t) => getComputedStyle(t).visibility === "visible" && t.innerText.trim().length > 0);
    }
    expect(shown, `the ${key} tooltip shows on hover`);
    const text = await tooltip.innerText();
    expect(!/\d+\.\d{2,}/.test(text), `the ${key} tooltip is rounded: ${text}`);
    expect(key !== "power" || /\d W/.test(text), `the power tooltip names watts: ${text}`);
    expect(await inside(tooltip, card), `the ${key} tooltip stays inside the card`);
  }
  await page.getByTestId("telemetry-charts").screenshot({ path: join(ARTIFACTS, "res-01-telemetry.png") });
  await page.mouse.move(0, 0);

  step("the Extend dialog offers +1 h, +4 h and +1 day with the extra cost and whether the GPUs are free");
  await page.getByRole("button", { name: "Extend", exact: true }).click();
  const dialog = page.getByRole("dialog", { name: "Extend the reservation" });
  await dialog.waitFor();
  for (const [choice, hours] of [["+4 h", 4], ["+1 day", 24], ["+1 h", 1]]) {
    await dialog.getByRole("button", { name: choice, exact: true }).click();
    await page.waitForFunction(
      (h) => {
        const t = document.querySelector('[data-testid="extend-cost"]');
        return t && t.textContent.startsWith(`+${h === 24 ? "24 h" : `${h} h`}`);
      },
      hours,
    );
    const cost = await dialog.getByTestId("extend-cost").innerText();
    const extra = Number(cost.match(/: ([\d.,]+) more credits/)[1].replace(/,/g, ""));
    // Quick choices count from the current end to the minute, so the extra time is a minute short at most.
    expect(Math.abs(extra - rate * hours) <= rate / 60 + 0.01, `${choice} costs ${rate} × ${hours} credits: ${cost}`);
    const free = await dialog.getByTestId("extend-free").innerText();
    expect(/GPUs are (not )?free until then/.test(free), `the dialog says whether the GPUs are free: ${free}`);
  }
  expect(/are free until then/.test(await dialog.getByTestId("extend-free").innerText()), "an hour more is free");
  await axeCheck(page, "reservation-extend-dialog");
  await shot(page, "res-02-extend-dialog");
  const endBefore = (await api(page, "GET", `reservations/${now.id}/`)).body.ends_at;
  await dialog.getByRole("button", { name: "Extend", exact: true }).click();
  await dialog.waitFor({ state: "hidden" });

  step("the extension event shows the old and the new end");
  const extension = page.getByTestId("event-extended").last();
  await extension.waitFor();
  const ends = await extension.getByTestId("event-extension-ends").innerText();
  const endAfter = (await api(page, "GET", `reservations/${now.id}/`)).body.ends_at;
  const berlin = (iso) =>
    new Date(iso).toLocaleString("en-GB", { timeZone: "Europe/Berlin", hour: "2-digit", minute: "2-digit" });
  expect(ends.includes(berlin(endBefore)) && ends.includes(berlin(endAfter)), `old and new end: ${ends} (${endBefore} -> ${endAfter})`);
  expect(!/running → running/.test(await page.locator(".mantine-Timeline-root").innerText()), "no 'running → running'");

  step("the header's relative times move on without a reload");
  await page.waitForFunction(
    (before) => {
      const t = document.querySelector('[data-testid="reservation-when"]')?.textContent ?? "";
      return t !== before && /started \d+ min ago/.test(t);
    },
    whenAtStart,
    { timeout: 90_000 },
  );
  const whenLater = await page.getByTestId("reservation-when").innerText();
  console.log(`e2e | header: "${whenAtStart}" -> "${whenLater}"`);
  await axeCheck(page, "reservation-running");

  step("Release asks first; keeping it changes nothing");
  await page.getByRole("button", { name: "Release now" }).click();
  const release = page.getByRole("dialog", { name: "Release the GPUs now?" });
  await release.waitFor();
  await axeCheck(page, "reservation-release-dialog");
  await release.getByRole("button", { name: "Keep it running" }).click();
  await release.waitFor({ state: "hidden" });
  await page.waitForTimeout(1000);
  expect((await stateOf(page, now.id)) === "running", "dismissing the dialog kept it running");

  step("released, the reservation ends with a summary of its duration, GPU-hours and credits");
  await page.getByRole("button", { name: "Release now" }).click();
  await release.getByRole("button", { name: "Release the GPUs" }).click();
  await waitForBadge(page, ["completed", "failed", "interrupted"], 90_000);
  booked.delete(now.id);
  const summary = await page.getByTestId("cost-summary").innerText();
  expect(/: \d+ (s|min), [\d.]+ GPU-h, [\d.]+ credits$/.test(summary), `the ended summary: ${summary}`);
  const whenEnded = await page.getByTestId("reservation-when").innerText();
  expect(/ended (now|\d+ min ago)/.test(whenEnded) && !/ends now/.test(whenEnded), `the header says it ended: ${whenEnded}`);
  await axeCheck(page, "reservation-completed");
  await shot(page, "res-03-completed");

  step("before its window, a reservation's GPUs are booked, not 'held: yes'; Cancel asks first");
  await page.goto(`${BASE}/reservations/${later.id}`);
  await page.getByRole("heading", { level: 1, name: "e2e cost later" }).waitFor();
  const held = await page.getByTestId("allocation-held").first().innerText();
  expect(/^booked from /.test(held), `not yet held: ${held}`);
  expect(/starts in \d+ h, ends in/.test(await page.getByTestId("reservation-when").innerText()), "starts in the future");
  await page.getByTestId("cost-booked").waitFor();
  await page.getByRole("button", { name: "Cancel reservation" }).click();
  const cancel = page.getByRole("dialog", { name: "Cancel this reservation?" });
  await cancel.waitFor();
  await axeCheck(page, "reservation-cancel-dialog");
  await cancel.getByRole("button", { name: "Keep the reservation" }).click();
  await cancel.waitFor({ state: "hidden" });
  expect((await stateOf(page, later.id)) === "scheduled", "dismissing the dialog kept it scheduled");
  await page.getByRole("button", { name: "Cancel reservation" }).click();
  await cancel.getByRole("button", { name: "Yes, cancel it" }).click();
  await waitForBadge(page, ["cancelled"], 30_000);
  booked.delete(later.id);
  const cancelledSummary = await page.getByTestId("cost-summary").innerText();
  expect(/0 s, 0 GPU-h, 0 credits$/.test(cancelledSummary), `cancelled before its window, it cost nothing: ${cancelledSummary}`);

  step("the history lists both and filters by state, project and period");
  await page.getByRole("link", { name: "History" }).click();
  await page.getByRole("heading", { level: 1, name: "History" }).waitFor();
  const historyRow = (id) => page.getByTestId(`history-row-${id}`);
  await historyRow(now.id).waitFor();
  await historyRow(later.id).waitFor();
  const nowRow = await historyRow(now.id).innerText();
  expect(/\d/.test(nowRow) && /completed|failed|interrupted/i.test(nowRow), `the finished row: ${nowRow}`);
  await axeCheck(page, "history");
  await shot(page, "res-04-history");

  await page.getByLabel("State", { exact: true }).first().click();
  await page.getByRole("option", { name: "cancelled" }).click();
  await page.keyboard.press("Escape");
  await historyRow(now.id).waitFor({ state: "detached" });
  await historyRow(later.id).waitFor();

  const projectAsked = page.waitForRequest((r) => r.url().includes("/api/v1/reservations/") && r.url().includes("project=demo"));
  await page.getByLabel("Project", { exact: true }).first().click();
  await page.getByRole("option", { name: "Demo project" }).click();
  await projectAsked;
  await historyRow(later.id).waitFor();

  await page.getByLabel("Ended", { exact: true }).first().click();
  await page.getByRole("option", { name: "Between two dates…" }).click();
  const tomorrow = new Date(Date.now() + 30 * 3_600_000);
  const local = (d) => {
    const p = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
  };
  await page.getByLabel("From", { exact: true }).fill(local(tomorrow));
  await page.getByLabel("To", { exact: true }).fill(local(new Date(tomorrow.getTime() + 3_600_000)));
  await page.getByText("No finished reservations match.").waitFor();
  await page.getByLabel("Ended", { exact: true }).first().click();
  await page.getByRole("option", { name: "Last 24 hours" }).click();
  await historyRow(later.id).waitFor();

  step("a token's Revoke asks first; revoked, its secret leaves the screen");
  await page.getByRole("link", { name: "API tokens" }).click();
  const tokenForm = page.getByRole("form", { name: "New token" });
  await tokenForm.waitFor();
  await tokenForm.getByLabel("Name").fill(tokenName);
  await page.getByRole("button", { name: "Create token" }).click();
  const secret = page.getByTestId("new-token");
  await secret.waitFor();
  await page.getByRole("button", { name: `Revoke token ${tokenName}` }).click();
  const revoke = page.getByRole("dialog", { name: "Revoke this token?" });
  await revoke.waitFor();
  await axeCheck(page, "tokens-revoke-dialog");
  await revoke.getByRole("button", { name: "Keep it" }).click();
  await revoke.waitFor({ state: "hidden" });
  expect(await secret.isVisible(), "keeping the token keeps its secret shown");
  await page.getByRole("button", { name: `Revoke token ${tokenName}` }).click();
  await revoke.getByRole("button", { name: "Revoke token", exact: true }).click();
  await secret.waitFor({ state: "detached" });
  await page.getByRole("row", { name: new RegExp(tokenName) }).getByText("revoked").first().waitFor();
  await axeCheck(page, "tokens");

  // --- phone ----------------------------------------------------------------------------------------
  step("on a phone the dashboard's rows are cards: the full state, the end time, nothing cut");
  const phoneRun = await book(page, "e2e phone", { gpus: 1 });
  await page.setViewportSize(PHONE);
  await page.goto(`${BASE}/`);
  const phoneCard = page.getByTestId(`reservation-row-${phoneRun.id}`);
  await phoneCard.waitFor({ timeout: START_TIMEOUT_MS });
  await page.waitForFunction(
    (id) => {
      const b = document.querySelector(`[data-testid="reservation-row-${id}"] [data-testid="state-badge"]`);
      return b && ["running", "starting"].includes(b.textContent.trim());
    },
    phoneRun.id,
    { timeout: START_TIMEOUT_MS },
  );
  const display = await phoneCard.evaluate((tr) => getComputedStyle(tr).display);
  expect(display === "block", `the row is a card: display ${display}`);
  const badge = phoneCard.getByTestId("state-badge");
  expect(await fullyShown(badge.locator(".mantine-Badge-label"), PHONE.width), "the state badge is not cut");
  const endCell = phoneCard.locator('td[data-label="Ends"]');
  expect(await fullyShown(endCell, PHONE.width), "the end time is on screen");
  expect(/in \d+ (min|h)/.test(await endCell.innerText()), "the end time is readable");
  expect((await phoneCard.locator('td[data-label="Cost so far"]').innerText()).includes("credits"), "the cost is on the card");
  await axeCheck(page, "dashboard-phone");
  await shot(page, "res-05-dashboard-phone");

  step("on a phone the history's rows are cards too");
  await page.goto(`${BASE}/history`);
  await historyRow(later.id).waitFor();
  const historyCard = historyRow(later.id);
  expect((await historyCard.evaluate((tr) => getComputedStyle(tr).display)) === "block", "the history row is a card");
  expect(await fullyShown(historyCard.getByTestId("state-badge").locator(".mantine-Badge-label"), PHONE.width), "the state is not cut");
  expect(await fullyShown(historyCard.locator('td[data-label="Ended"]'), PHONE.width), "the end is on screen");
  await axeCheck(page, "history-phone");
  await shot(page, "res-06-history-phone");

  step("on a phone the Copy buttons keep their label");
  await page.goto(`${BASE}/reservations/${phoneRun.id}`);
  await waitForBadge(page, ["running"]);
  const connect = page.getByTestId("connect-panel");
  await page.waitForFunction(() => {
    const p = document.querySelector('[data-testid="connect-panel"]');
    return p && (p.getAttribute("data-ready") === "yes" || /no SSH gateway/.test(p.textContent || ""));
  }, null, { timeout: 30_000 });
  if ((await connect.getAttribute("data-ready")) === "yes") {
    const copy = connect.getByRole("button", { name: "Copy the SSH command" });
    expect((await copy.innerText()) === "Copy" && (await fullyShown(copy, PHONE.width)), "the ssh Copy button is whole");
  }
  await axeCheck(page, "reservation-phone");
  await shot(page, "res-07-reservation-phone");
  await page.getByRole("button", { name: "Release now" }).click();
  await page.getByRole("dialog", { name: "Release the GPUs now?" }).getByRole("button", { name: "Release the GPUs" }).click();
  await waitForBadge(page, ["ending", "completed", "failed", "interrupted"], 60_000);
  booked.delete(phoneRun.id);

  await page.getByRole("button", { name: "Toggle navigation" }).click();
  await page.getByRole("link", { name: "API tokens" }).click();
  const phoneForm = page.getByRole("form", { name: "New token" });
  await phoneForm.waitFor();
  await phoneForm.getByLabel("Name").fill(phoneTokenName);
  await page.getByRole("button", { name: "Create token" }).click();
  await page.getByTestId("new-token").waitFor();
  const copyToken = page.getByRole("button", { name: "Copy the token" });
  expect((await copyToken.innerText()) === "Copy" && (await fullyShown(copyToken, PHONE.width)), "the token's Copy button is whole");
  const tokenRow = page.getByRole("row", { name: new RegExp(phoneTokenName) });
  expect((await tokenRow.evaluate((tr) => getComputedStyle(tr).display)) === "block", "the token row is a card");
  await axeCheck(page, "tokens-phone");
  await shot(page, "res-08-tokens-phone");
  await page.getByRole("button", { name: `Revoke token ${phoneTokenName}` }).click();
  await page.getByRole("dialog", { name: "Revoke this token?" }).getByRole("button", { name: "Revoke token", exact: true }).click();
  await page.getByTestId("new-token").waitFor({ state: "detached" });
  await page.setViewportSize(DESKTOP);
}
