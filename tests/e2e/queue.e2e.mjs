// The queue on the portal (issue 13): a tenant queues a request in the portal that cannot start yet (its GPUs
// are booked), sees it in the Queue page with its position, estimated start and reason, an operator sees it in
// the whole queue, and the tenant cancels it (the Queue page at phone width too). Then a preemptible request
// the queue starts shows as yielding capacity on the timeline, and its reservation page shows the class's terms. Run by tests/e2e/test_portal.py. Everything
// made here is cancelled at the end.

import { BASE, DESKTOP, PHONE, apiSession, axeCheck, expect, operator, run, shot, signIn, signOut, step, tenant } from "./lib.mjs";

const MIN = 60_000;
const NAME = `e2e queued ${Date.now() % 100000}`;
const FORMAT = /\d{2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4}, \d{2}:\d{2}/;

async function until(what, probe, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    expect(Date.now() < deadline, `timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

await run("queue", async (page) => {
  const api = await apiSession(tenant);
  const made = { reservations: [], requests: [] };
  try {
    step("book one of the four A100s ahead, so four cannot start now");
    const start = Math.ceil((Date.now() + 30 * MIN) / MIN) * MIN;
    const end = start + 120 * MIN;
    const blocker = await api("POST", "reservations/", {
      project: "demo",
      name: "e2e queue blocker",
      spec: { gpu_model: "A100-40GB", gpu_count: 1 },
      window: { start: new Date(start).toISOString(), end: new Date(end).toISOString() },
      container: { image: "gpucp-busybox:test", command: [], env: {} },
    });
    expect(blocker.status === 201, `the blocking booking: ${blocker.status} ${JSON.stringify(blocker.data)}`);
    made.reservations.push(blocker.data.id);

    step("queue four A100s in the portal");
    await signIn(page, tenant);
    await page.getByRole("link", { name: "Queue", exact: true }).click();
    await page.waitForURL(/\/queue$/);
    const form = page.getByRole("form", { name: "Queue a request" });
    await form.waitFor();
    await form.getByRole("textbox", { name: "Name" }).fill(NAME);
    await form.getByRole("textbox", { name: "GPU model", exact: true }).click();
    await page.getByRole("option", { name: /A100-40GB/ }).click();
    await form.getByRole("textbox", { name: "GPUs", exact: true }).fill("4");
    await form.getByRole("textbox", { name: "Duration (hours)" }).fill("1");
    await form.getByRole("radio", { name: "Preemptible" }).check();
    await form.getByText("Queue it again if it is preempted").waitFor();
    await form.getByRole("radio", { name: "Normal" }).check();
    expect((await form.getByText("Queue it again if it is preempted").count()) === 0, "requeue is offered only for preemptible");
    await axeCheck(page, "queue-form");
    await form.getByRole("button", { name: "Queue the request" }).click();
    await form.getByTestId("queue-submitted").waitFor();

    step("see it in the queue with its position and estimated start");
    const row = page.getByTestId(`request-${NAME}`);
    await row.waitFor();
    const id = (await row.getAttribute("id")).replace(/^request-/, "");
    made.requests.push(id);
    const detail = await until("the server's estimate", async () => {
      const d = (await api("GET", `requests/${id}/`)).data;
      return d.state === "queued" && d.estimated_start ? d : null;
    });
    expect(Date.parse(detail.estimated_start) >= end - MIN, `it waits for the booking to end: ${detail.estimated_start}`);
    await until("the row's estimate", async () => FORMAT.test(await row.getByTestId("request-estimate").innerText()));
    const estimate = await row.getByTestId("request-estimate").innerText();
    const shown = new Date(detail.estimated_start).toISOString().slice(11, 16);
    expect(estimate.includes(shown), `the estimate is shown in the zone shown (UTC here): ${estimate} vs ${shown}`);
    expect(/#\d+ in the queue/.test(await row.getByTestId("request-position").innerText()), "its position is shown");
    await row.getByText("Normal").waitFor();
    await shot(page, "queue-01-waiting");
    await axeCheck(page, "queue-list");

    step("a refused submit shows the server's error at the field");
    await form.getByRole("textbox", { name: "GPUs", exact: true }).fill("64");
    await form.getByRole("button", { name: "Queue the request" }).click();
    await form.getByTestId("queue-error").waitFor();
    await form.getByRole("textbox", { name: "GPUs", exact: true }).fill("4");

    step("an operator sees it in the whole queue with its reason");
    await signOut(page);
    await signIn(page, operator);
    await page.getByRole("link", { name: "Whole queue" }).click();
    await page.getByRole("heading", { level: 1, name: "Whole queue" }).waitFor();
    const entry = page.getByTestId(`queue-entry-${NAME}`);
    await entry.waitFor();
    await entry.getByRole("button", { name: `Hold ${NAME}` }).waitFor();
    await shot(page, "queue-02-operator");
    await axeCheck(page, "queue-operator");
    await signOut(page);

    step("cancel the queued request in the portal");
    await signIn(page, tenant);
    await page.getByRole("link", { name: "Queue", exact: true }).click();
    const again = page.getByTestId(`request-${NAME}`);
    await again.getByRole("button", { name: `Cancel request ${NAME}` }).click();
    const dialog = page.getByRole("dialog");
    await dialog.getByRole("button", { name: "Cancel the request" }).click();
    await dialog.waitFor({ state: "hidden" });
    await again.getByTestId("state-badge").getByText("cancelled").waitFor();
    expect((await again.getByRole("button", { name: `Cancel request ${NAME}` }).count()) === 0, "no cancel once cancelled");
    const after = (await api("GET", `requests/${id}/`)).data;
    expect(after.state === "cancelled", `the server says cancelled: ${after.state}`);
    await shot(page, "queue-04-cancelled");

    step("the queue at phone width: rows as cards, nothing wider than the screen");
    await page.setViewportSize(PHONE);
    await again.waitFor();
    const wide = await page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth + 1);
    expect(!wide, "the queue page does not scroll sideways on a phone");
    await axeCheck(page, "queue-phone");
    await page.setViewportSize(DESKTOP);

    // Only now: the queue is strict priority, so the waiting request above held the pass up until cancelled.
    step("a preemptible request the queue starts is yielding capacity on the timeline");
    const pre = await api("POST", "requests/", {
      project: "demo",
      name: "e2e preemptible",
      spec: { gpu_model: "H100-80GB", gpu_count: 1 },
      duration: 1800,
      priority_class: "preemptible",
      container: { image: "gpucp-busybox:test", command: [], env: {} },
    });
    expect(pre.status === 201, `the preemptible request: ${pre.status} ${JSON.stringify(pre.data)}`);
    made.requests.push(pre.data.id);
    const started = await until("the pass to start it", async () => {
      const d = (await api("GET", `requests/${pre.data.id}/`)).data;
      return d.reservation ? d : null;
    });
    made.reservations.push(started.reservation);
    await page.goto(`${BASE}/availability`);
    await page.getByTestId("timeline").waitFor();
    await page.getByTestId("timeline-legend").getByText("preemptible").waitFor();
    await page.getByTestId("segment-yielding").first().waitFor({ timeout: 30_000 });
    await shot(page, "queue-03-yielding");
    await axeCheck(page, "queue-timeline");

    step("its reservation page shows the class's terms");
    await page.goto(`${BASE}/reservations/${started.reservation}`);
    await page.getByTestId("preemptible-badge").waitFor();
    await page.getByTestId("preemptible-notice").getByText(/120 s of notice/).waitFor();
    await page.getByTestId("cost-multiplier").getByText(/0\.5 ×/).waitFor();
    await axeCheck(page, "queue-reservation");
  } finally {
    for (const r of made.requests) await api("POST", `requests/${r}/cancel/`, { reason: "e2e: done" }).catch(() => {});
    for (const r of made.reservations) await api("POST", `reservations/${r}/cancel/`, { reason: "e2e: done" }).catch(() => {});
  }
});
