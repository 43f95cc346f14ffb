// Booking and time on the portal (issue 12): the timeline's axis has dates and hours in the viewer's zone,
// names the zone and switches to UTC; a click at "now" books starting now; the Book button is never offered
// for a refused booking; the pick is drawn on the GPUs a booking would get; draining capacity is drawn as
// unavailable with its reason; zoom and the keyboard; axe; a phone. Run by tests/e2e/test_portal.py, in
// Europe/Berlin and then America/Los_Angeles. Every booking made here is cancelled, the drained server
// returned to ready.

import { BASE, PHONE, apiSession, axeCheck, expect, operator, run, shot, signIn, step, tenant } from "./lib.mjs";

const HOUR = 3_600_000;
const FORMAT = /^\d{2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4}, \d{2}:\d{2}$/;

/** The wall clock of `ms` in `zone`, as the portal writes it ("01 Dec 2026, 12:00"). */
function written(ms, zone) {
  const p = Object.fromEntries(
    new Intl.DateTimeFormat("en-US", { timeZone: zone, hourCycle: "h23", year: "numeric", month: "numeric", day: "numeric", hour: "numeric", minute: "numeric" })
      .formatToParts(new Date(ms))
      .map((x) => [x.type, x.value]),
  );
  const months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  const pad = (n) => String(n).padStart(2, "0");
  return `${pad(p.day)} ${months[p.month - 1]} ${p.year}, ${pad(Number(p.hour) % 24)}:${pad(p.minute)}`;
}
const clock = (ms, zone) => written(ms, zone).slice(-5);

async function axisMarks(page) {
  const read = (id) =>
    page.getByTestId(id).evaluateAll((els) => els.map((e) => ({ at: Number(e.getAttribute("data-at")), label: e.textContent })));
  return { days: await read("axis-day"), hours: await read("axis-hour") };
}

/** The axis names whole days and hours of `zone`: distinct dates, hour labels that are that zone's clock. */
async function checkAxis(page, zone, days) {
  const { days: dayMarks, hours } = await axisMarks(page);
  const labels = dayMarks.map((d) => d.label);
  expect(labels.length >= days && new Set(labels).size === labels.length, `${days}-day axis: one label per date: ${labels}`);
  expect(labels.every((l) => /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{2} [A-Z][a-z]{2}$/.test(l)), `date labels: ${labels}`);
  expect(hours.length >= 2, `hour labels on the ${days}-day axis: ${hours.length}`);
  for (const h of hours) {
    expect(h.label === clock(h.at, zone), `hour label ${h.label} is ${zone}'s clock at ${new Date(h.at).toISOString()} (${clock(h.at, zone)})`);
    expect(h.label.endsWith(":00"), `hour labels sit on whole hours of ${zone}: ${h.label}`);
  }
  // Between consecutive labelled hours the same step, so no two neighbours read the same time.
  for (let i = 1; i < hours.length; i++) expect(hours[i].label !== hours[i - 1].label, `neighbouring hour labels differ: ${hours.map((h) => h.label)}`);
  return { labels, hours };
}

async function openAvailability(page) {
  await page.goto(`${BASE}/availability`);
  await page.getByTestId("timeline").waitFor();
  await page.getByTestId("axis-day").first().waitFor();
}

async function setGpus(page, n) {
  await page.getByLabel("GPUs", { exact: true }).fill(String(n));
  await page.getByRole("button", { name: new RegExp(`^Book ${n} GPUs?$`) }).waitFor();
}

async function freeLine(page) {
  await page.waitForFunction(() => {
    const line = document.querySelector('[data-testid="free-line"]');
    return line && !document.body.textContent.includes("Checking the window");
  });
  return page.getByTestId("free-line").innerText();
}

const reservationId = (url) => url.match(/\/reservations\/([0-9a-f-]{36})$/)[1];

async function bookingWalk(page, zone) {
  const api = await apiSession(tenant);
  const booked = [];
  let drained = null;
  let ops = null;
  try {
    step(`${zone}: the page's title is a heading of level 1 and the zone is named`);
    await signIn(page, tenant);
    await openAvailability(page);
    await page.getByRole("heading", { level: 1, name: "Book GPUs" }).waitFor();
    const named = await page.getByTestId("timeline-zone").innerText();
    expect(named.includes(zone), `the timeline names the zone: ${named}`);
    const toggle = await page.getByTestId("zone-toggle").getAttribute("aria-label");
    expect(toggle.includes(zone), `the header names the zone: ${toggle}`);

    step(`${zone}: the 3- and 7-day axes have a date row and distinct hours in the viewer's zone`);
    await checkAxis(page, zone, 3);
    const start = await page.getByLabel("Start", { exact: true }).inputValue();
    expect(FORMAT.test(start), `the date field is in the one format: ${start}`);
    await page.getByText("7 days", { exact: true }).click();
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="axis-day"]').length >= 7);
    await checkAxis(page, zone, 7);
    await shot(page, `booking-${zone.replace("/", "-")}-7days`);
    await page.getByText("3 days", { exact: true }).click();
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="axis-day"]').length <= 4);

    step(`${zone}: the UTC toggle changes the labels and the date fields, and is remembered`);
    const before = await page.getByLabel("Start", { exact: true }).inputValue();
    await page.getByTestId("zone-toggle").getByText("UTC", { exact: true }).click();
    await page.getByText("Times in UTC").waitFor();
    await checkAxis(page, "UTC", 3);
    const inUtc = await page.getByLabel("Start", { exact: true }).inputValue();
    expect(inUtc !== before && FORMAT.test(inUtc), `the start field follows the zone: ${before} -> ${inUtc}`);
    await page.reload();
    await page.getByText("Times in UTC").waitFor();
    await page.getByTestId("zone-toggle").getByText(zone.split("/").pop().replace(/_/g, " "), { exact: true }).click();
    await page.getByText(`Times in ${zone}`).waitFor();

    step(`${zone}: the Book button is disabled while quota problems are listed`);
    await setGpus(page, 900);
    await page.getByTestId("booking-problems").waitFor();
    const problems = await page.getByTestId("booking-problems").innerText();
    expect(problems.length > 10, `problems are listed: ${problems}`);
    expect(await page.getByRole("button", { name: "Book 900 GPUs" }).isDisabled(), "Book is disabled while problems are listed");
    await page.getByTestId("book-why").waitFor();

    step(`${zone}: the pick is drawn only on the GPUs the booking would get`);
    for (const n of [1, 2]) {
      await setGpus(page, n);
      const line = await freeLine(page);
      expect(/fits/.test(line), `${n} GPU(s) fit: ${line}`);
      await page.waitForFunction((k) => document.querySelectorAll('[data-testid="pick"]').length === k, n);
      const rows = await page.locator('[data-testid="timeline"] .tl-track').count();
      expect(rows > n, `the timeline has more rows (${rows}) than picks (${n})`);
    }

    step(`${zone}: a click at the red now line starts the window now, and the booking succeeds`);
    await setGpus(page, 1);
    await page.getByLabel(/^Name/).fill(`e2e now ${zone}`);
    const now = page.getByTestId("timeline-pick").locator(".tl-now");
    const box = await now.boundingBox();
    const clickedAt = Date.now();
    await page.getByTestId("timeline-pick").click({ position: { x: box.x - (await page.getByTestId("timeline-pick").boundingBox()).x + 1, y: 8 } });
    expect(await page.getByLabel("Start now").isChecked(), "a click at now means start now");
    const fits = await freeLine(page);
    expect(/fits/.test(fits), `the window fits: ${fits}`);
    await page.getByRole("button", { name: "Book 1 GPU" }).click();
    await page.waitForURL(/\/reservations\/[0-9a-f-]{36}$/);
    const id = reservationId(page.url());
    booked.push(id);
    const detail = (await api("GET", `reservations/${id}/`)).data;
    const startedAt = Date.parse(detail.starts_at);
    expect(Math.abs(startedAt - clickedAt) < 2 * 60_000, `it starts now: ${detail.starts_at} (clicked ${new Date(clickedAt).toISOString()})`);

    step(`${zone}: the keyboard sets "in 3 hours" on the default view, and the picker says what it set`);
    await openAvailability(page);
    const slider = page.getByTestId("timeline-pick");
    await slider.focus();
    await page.keyboard.press("Home");
    expect(await page.getByLabel("Start now").isChecked(), "Home starts now");
    const t0 = Date.now();
    for (let i = 0; i < 3; i++) await page.keyboard.press("ArrowRight");
    const set = await page.getByLabel("Start", { exact: true }).inputValue();
    const want = [written(t0 + 3 * HOUR, zone), written(t0 + 3 * HOUR + 60_000, zone), written(t0 + 3 * HOUR - 60_000, zone)];
    expect(want.includes(set), `three arrow presses set the start in 3 hours: ${set} (want ${want[0]})`);
    const valueText = await slider.getAttribute("aria-valuetext");
    expect(valueText.includes(set) && /in 3 h/.test(valueText), `the slider announces what it set: ${valueText}`);
    await page.waitForFunction((s) => document.querySelector('[data-testid="timeline-announce"]')?.textContent.includes(s), set);
    await page.keyboard.press("Shift+ArrowRight");
    const quarter = await page.getByLabel("Start", { exact: true }).inputValue();
    expect(quarter !== set, `Shift+arrow moves by 15 minutes: ${set} -> ${quarter}`);
    await page.keyboard.press("Shift+ArrowLeft");
    await page.getByLabel(/^Name/).fill(`e2e in 3 hours ${zone}`);
    await page.getByRole("button", { name: "Book 1 GPU" }).click();
    await page.waitForURL(/\/reservations\/[0-9a-f-]{36}$/);
    booked.push(reservationId(page.url()));

    step(`${zone}: zoom stretches the axis to hours; hover text on a booking is in the one format`);
    await openAvailability(page);
    for (let i = 0; i < 3; i++) await page.getByRole("button", { name: "Zoom in" }).click();
    await page.getByTestId("timeline-zoom").getByText("8×").waitFor();
    const { hours } = await axisMarks(page);
    expect(hours.length > 24 && hours[1].at - hours[0].at === HOUR, `zoomed in, an hour per label: ${hours.slice(0, 4).map((h) => h.label)}`);
    // The 2-hour booking just made (earlier ones, released after minutes, are short).
    const widths = await page.locator(".tl-seg.mine").evaluateAll((els) => els.map((e) => e.getBoundingClientRect().width));
    const widest = widths.indexOf(Math.max(...widths));
    const width = widths[widest];
    expect(width >= 80, `a 2-hour booking is wide enough to see and hover when zoomed: ${width}px`);
    const title = await page.locator(".tl-seg.mine").nth(widest).getAttribute("title");
    expect(/\d{2} [A-Z][a-z]{2} \d{4}, \d{2}:\d{2} – \d{2} [A-Z][a-z]{2} \d{4}, \d{2}:\d{2}$/.test(title), `hover text in the one format: ${title}`);
    await shot(page, `booking-${zone.replace("/", "-")}-zoomed`);
    await page.getByRole("button", { name: "Zoom out" }).click();
    await page.getByTestId("timeline-zoom").getByText("4×").waitFor();

    step(`${zone}: a draining server is drawn unavailable with the reason`);
    ops = await apiSession(operator);
    const servers = (await ops("GET", "servers/?limit=100")).data.results;
    const target = servers.find((s) => s.state === "ready" && s.gpus.length);
    expect(target, "a ready server to drain");
    const reason = `e2e ${zone}: fan replacement`;
    const drain = await ops("POST", `servers/${target.id}/state/`, { state: "draining", reason });
    expect(drain.status === 200, `drained ${target.hostname}: ${drain.status} ${JSON.stringify(drain.data)}`);
    drained = target;
    await openAvailability(page);
    await page.getByTestId(`unavailable-${target.hostname}`).waitFor();
    const headerText = await page.getByTestId(`unavailable-${target.hostname}`).locator("..").innerText();
    expect(/draining/i.test(headerText) && headerText.includes(reason), `the server says why: ${headerText}`);
    const rows = page.locator(`[data-testid^="gpu-row-${target.hostname}-"]`);
    const n = await rows.count();
    expect(n === target.gpus.length, `every GPU of ${target.hostname} is listed: ${n}`);
    for (let i = 0; i < n; i++) {
      expect((await rows.nth(i).getAttribute("data-unavailable")) === "draining", `GPU row ${i} is unavailable`);
      const hatch = rows.nth(i).getByTestId("unavailable");
      expect((await hatch.getAttribute("title")).includes(reason), "its hover text gives the reason");
    }
    await shot(page, `booking-${zone.replace("/", "-")}-draining`);
  } finally {
    if (drained) {
      const back = await ops("POST", `servers/${drained.id}/state/`, { state: "ready", reason: "e2e: done" });
      expect(back.status === 200, `returned ${drained.hostname} to ready: ${back.status}`);
    }
    for (const id of booked) {
      const detail = (await api("GET", `reservations/${id}/`)).data;
      // Cancel: before the window it releases everything, during it the window ends now.
      if (["pending", "scheduled", "starting", "running"].includes(detail.state)) {
        const done = await api("POST", `reservations/${id}/cancel/`, { reason: "e2e: done" });
        expect(done.status === 200, `cancel ${id}: ${done.status} ${JSON.stringify(done.data)}`);
      }
    }
  }
}

await run(
  "booking",
  async (page) => {
    await bookingWalk(page, "Europe/Berlin");
    step("Europe/Berlin: axe finds no serious problem on the availability page");
    await openAvailability(page);
    await axeCheck(page, "availability");
  },
  { timezoneId: "Europe/Berlin" },
);

await run(
  "booking-la",
  async (page) => {
    await bookingWalk(page, "America/Los_Angeles");
    step("America/Los_Angeles: the availability page at phone width");
    await page.setViewportSize(PHONE);
    await openAvailability(page);
    await checkAxis(page, "America/Los_Angeles", 3);
    const compact = page.getByTestId("zone-toggle-compact");
    await compact.waitFor();
    const compactName = await compact.getAttribute("aria-label");
    expect(/Los_Angeles/.test(compactName), `the phone header names the zone: ${compactName}`);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    expect(overflow <= 1, `the page does not scroll sideways at phone width (${overflow}px too wide)`);
    await page.getByRole("button", { name: "Book 1 GPU" }).scrollIntoViewIfNeeded();
    await shot(page, "booking-phone");
    step("America/Los_Angeles: axe at phone width");
    await axeCheck(page, "availability-phone");
  },
  { timezoneId: "America/Los_Angeles" },
);
