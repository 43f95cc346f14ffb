// The main walk through the portal in headless Chromium: a tenant books, watches and cancels; an operator
// drains a server. Run by tests/e2e/test_portal.py against a running system; what it shares with the other
// scripts (the browser, sign-in, screenshots, axe) is in lib.mjs.

import { readFileSync } from "node:fs";
import { join } from "node:path";

import { ARTIFACTS, BASE, axeCheck, expect, operator, run, shot, signIn, signOut, sshPublicKey, step, tenant } from "./lib.mjs";

const START_TIMEOUT_MS = Number(process.env.START_TIMEOUT_S ?? 150) * 1000;

await run("portal", async (page) => {
  // --- tenant ---------------------------------------------------------------------------------------
  step("a signed-out visitor is sent to the sign-in page");
  await page.goto(`${BASE}/availability`);
  await page.waitForURL(/\/login\?next=/);
  await shot(page, "01-login");
  await axeCheck(page, "login");

  step("a wrong password is refused in words");
  await page.getByLabel("Username").fill(tenant.user);
  await page.getByLabel("Password").fill("not-the-password");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("alert").waitFor();
  await axeCheck(page, "login-error");

  step("the tenant signs in and sees the dashboard");
  await signIn(page, tenant);
  await page.goto(`${BASE}/`);
  await page.getByTestId("project-demo").waitFor();
  const projectCard = await page.getByTestId("project-demo").innerText();
  expect(/credits/.test(projectCard), `project card shows credits: ${projectCard}`);
  await shot(page, "02-dashboard");
  await axeCheck(page, "dashboard");

  step("availability shows the timeline and the quota effect");
  await page.getByRole("link", { name: "Book GPUs" }).first().click();
  await page.getByTestId("timeline").waitFor();
  await page.getByLabel("GPUs", { exact: true }).fill("2");
  await page.getByLabel("Start now").check();
  await page.getByTestId("free-line").waitFor();
  const effect = await page.getByTestId("quota-effect").innerText();
  expect(/credits/.test(effect) && /Balance/.test(effect), `quota effect is shown: ${effect}`);
  await shot(page, "03-availability");
  await axeCheck(page, "availability");

  step("an impossible booking is not offered: the problems are listed and Book is disabled");
  await page.getByLabel("GPUs", { exact: true }).fill("4000");
  const refusal = await page.getByTestId("booking-problems").innerText();
  expect(refusal.length > 25, `the problems say why: ${refusal}`);
  expect(await page.getByRole("button", { name: /^Book 4000 GPUs/ }).isDisabled(), "Book is disabled");
  await shot(page, "04-booking-refused");

  step("the tenant books 2 GPUs starting now");
  await page.getByLabel("GPUs", { exact: true }).fill("2");
  await page.getByLabel(/^Name/).fill("e2e run");
  await page.getByRole("button", { name: /^Book 2 GPUs/ }).click();
  await page.waitForURL(/\/reservations\/[0-9a-f-]{36}$/);
  const runningUrl = page.url();

  step("the reservation starts and its container reports");
  await page.getByTestId("state-badge").first().waitFor();
  const deadline = Date.now() + START_TIMEOUT_MS;
  let state = "";
  while (Date.now() < deadline) {
    state = (await page.getByTestId("state-badge").first().innerText()).toLowerCase();
    if (state === "running") break;
    await page.waitForTimeout(2000);
  }
  expect(state === "running", `reservation reached running (last seen: ${state})`);
  await page.locator('[data-testid="launches"], [data-testid="not-available"]').first().waitFor();

  step("the Connect panel gives the ssh command and the gateway's known_hosts line; the log panel follows");
  const connect = page.getByTestId("connect-panel");
  await connect.waitFor();
  // With a Docker engine the demo agents run SSH gateways; without one the panel says there is none.
  await page.waitForFunction(() => {
    const panel = document.querySelector('[data-testid="connect-panel"]');
    return panel && (panel.getAttribute("data-ready") === "yes" || /no SSH gateway/.test(panel.textContent || ""));
  }, null, { timeout: 30_000 });
  if ((await connect.getAttribute("data-ready")) === "yes") {
    const command = await connect.getByLabel("SSH command", { exact: true }).innerText();
    expect(/^ssh -p \d+ [0-9a-f-]{36}@\S+$/.test(command), `an ssh command is shown: ${command}`);
    const known = await connect.getByLabel("known_hosts line", { exact: true }).innerText();
    expect(/^\[\S+\]:\d+ ssh-ed25519 AAAA/.test(known), `a known_hosts line is shown: ${known}`);
    await connect.getByRole("button", { name: "Copy the SSH command" }).waitFor();
    console.log(`e2e | connect: ${command}`);
  } else {
    console.log("e2e | connect: this system runs no SSH gateway (no Docker engine), as the panel says");
  }
  await page.getByRole("log").waitFor();

  step("the tenant sees live utilization, memory and power charts of her GPUs");
  await page.getByTestId("telemetry-charts").waitFor({ timeout: 60_000 });
  await page.waitForFunction(() => {
    const charts = [...document.querySelectorAll('[data-testid^="telemetry-chart-"]')];
    return charts.some((c) => Number(c.getAttribute("data-points")) > 0 && c.querySelector(".recharts-line"));
  }, null, { timeout: 60_000 });
  await page.waitForTimeout(7000); // two more polls: the charts move, the log tail grows
  const points = await page.locator('[data-testid^="telemetry-chart-"]').evaluateAll((charts) =>
    Object.fromEntries(charts.map((c) => [c.getAttribute("data-testid"), Number(c.getAttribute("data-points"))])),
  );
  expect(points["telemetry-chart-util"] > 0, `the utilization chart has points: ${JSON.stringify(points)}`);
  // DCGM's profiling fields: the simulated GPUs report them, so the SM activity chart has points too.
  expect(points["telemetry-chart-sm"] > 0, `the SM activity chart has points: ${JSON.stringify(points)}`);
  // The demo fleet is simulated, and the page says so beside the figures.
  await page.getByTestId("telemetry-simulated").waitFor();
  await shot(page, "05-reservation-running");
  await axeCheck(page, "reservation-running");
  await page.getByTestId("telemetry-charts").screenshot({ path: join(ARTIFACTS, "05b-telemetry-charts.png") });

  step("the tenant releases the running reservation");
  await page.getByRole("button", { name: "Release now" }).click();
  await page.getByRole("dialog", { name: "Release the GPUs now?" }).getByRole("button", { name: "Release the GPUs" }).click();
  await page.waitForFunction(() => {
    const b = document.querySelector('[data-testid="state-badge"]');
    return b && !["running", "starting"].includes(b.textContent.trim().toLowerCase());
  }, null, { timeout: 60_000 });

  step("a future booking, made with the keyboard only, is cancelled");
  await page.goto(`${BASE}/availability`);
  await page.getByTestId("timeline").waitFor();
  const startField = page.getByLabel("Start", { exact: true });
  const startBefore = await startField.inputValue();
  await page.getByTestId("timeline-pick").focus();
  await page.keyboard.press("ArrowRight");
  await page.keyboard.press("ArrowRight");
  const startPicked = await startField.inputValue();
  expect(startPicked !== "" && startPicked !== startBefore, `arrow keys on the timeline move the start: ${startBefore} -> ${startPicked}`);
  await page.getByLabel("GPUs", { exact: true }).focus();
  await page.keyboard.press("ControlOrMeta+A");
  await page.keyboard.type("1");
  await page.getByLabel(/^Name/).focus();
  await page.keyboard.type("e2e later");
  await page.keyboard.press("Enter"); // submits the booking form
  await page.waitForURL(/\/reservations\/[0-9a-f-]{36}$/);
  expect(page.url() !== runningUrl, "a second reservation was made");
  await page.getByRole("button", { name: "Cancel reservation" }).click();
  await page.getByRole("dialog", { name: "Cancel this reservation?" }).getByRole("button", { name: "Yes, cancel it" }).click();
  await page.getByText("cancelled", { exact: true }).first().waitFor();
  await shot(page, "06-reservation-cancelled");

  step("usage report and CSV download");
  await page.getByRole("link", { name: "Usage" }).click();
  const csvLink = page.getByTestId("csv-download");
  const notAvailable = page.getByTestId("not-available");
  await csvLink.or(notAvailable).first().waitFor();
  if (await csvLink.count()) {
    const [download] = await Promise.all([page.waitForEvent("download"), csvLink.click()]);
    const saved = join(ARTIFACTS, "usage.csv");
    await download.saveAs(saved);
    const csv = readFileSync(saved, "utf8");
    expect(/gpu_hours/.test(csv.split("\n")[0]), `CSV has a header row: ${csv.slice(0, 200)}`);
  } else {
    console.log("e2e | usage report not available on this server: shown as such");
  }
  await shot(page, "07-usage");
  await axeCheck(page, "usage");

  step("the efficiency statement: this month beside the previous one and the fleet");
  await page.getByRole("link", { name: "Efficiency" }).click();
  await page.getByRole("heading", { level: 1, name: "Efficiency" }).waitFor();
  await page.getByTestId("efficiency-totals").waitFor();
  await page.getByRole("table", { name: "Comparison" }).waitFor();
  await shot(page, "07b-efficiency");
  await axeCheck(page, "efficiency");

  step("API tokens: create (shown once) and revoke");
  await page.getByRole("link", { name: "API tokens" }).click();
  await page.getByLabel("Name").fill("e2e script");
  await page.getByRole("button", { name: "Create token" }).click();
  await page.getByTestId("new-token").waitFor();
  await shot(page, "08-tokens");
  await axeCheck(page, "tokens");
  await page.getByRole("button", { name: "Revoke token e2e script" }).first().click();
  await page.getByRole("dialog", { name: "Revoke this token?" }).getByRole("button", { name: "Revoke token", exact: true }).click();
  await page.getByText("revoked").first().waitFor();

  step("SSH keys: a private key refused, a public key added with its fingerprint, then deleted");
  await page.getByRole("link", { name: "SSH keys" }).click();
  // The page loads lazily: until its form is there, "Name" is still the tokens page's field.
  const keyForm = page.getByRole("form", { name: "New SSH key" });
  await keyForm.waitFor();
  await keyForm.getByLabel("Name").fill("e2e laptop");
  await keyForm.getByLabel("Public key").fill("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----");
  await page.getByRole("button", { name: "Add key" }).click();
  await page.getByText("This is a private key").waitFor();
  await keyForm.getByLabel("Public key").fill(sshPublicKey("e2e@portal"));
  await page.getByRole("button", { name: "Add key" }).click();
  await page.getByTestId("added-key").waitFor();
  await page.getByRole("cell", { name: /^SHA256:/ }).first().waitFor();
  await shot(page, "08b-ssh-keys");
  await axeCheck(page, "ssh-keys");
  await page.getByRole("button", { name: "Delete key e2e laptop" }).click();
  await page.getByRole("button", { name: "Delete key", exact: true }).click();
  await page.getByText("You have no SSH keys.").waitFor();

  step("volumes page");
  await page.getByRole("link", { name: "Volumes" }).click();
  await page.getByRole("heading", { name: "Volumes" }).waitFor();
  await page.getByRole("form", { name: "New volume" }).or(page.getByText("You are in no project.")).first().waitFor();
  await page.waitForLoadState("networkidle");
  await axeCheck(page, "volumes");

  step("secrets: alice adds a secret; it is listed by name and its value is nowhere in the page");
  await page.getByRole("link", { name: "Secrets & registries" }).click();
  const secretForm = page.getByRole("form", { name: "New secret" });
  await secretForm.waitFor();
  const secretName = `E2E_TOKEN_${Date.now().toString(36).toUpperCase()}`;
  const secretValue = `e2e-secret-value-${Math.random().toString(36).slice(2)}`;
  await secretForm.getByLabel("Name").fill(secretName);
  await secretForm.getByLabel(/^Value/).fill(secretValue);
  await secretForm.getByRole("button", { name: "Add secret" }).click();
  await page.getByTestId("secret-saved").waitFor();
  await page.getByTestId(`secret-${secretName}`).waitFor();
  expect((await page.content()).includes(secretValue) === false, "the secret's value is in the page's HTML");
  expect((await secretForm.getByLabel(/^Value/).inputValue()) === "", "the value field was not emptied");
  await shot(page, "08c-secrets");
  await axeCheck(page, "secrets");
  // The booking form offers it by name, as a variable and/or a file.
  await page.getByRole("link", { name: "Book GPUs" }).click();
  const bookingForm = page.getByRole("form", { name: "Booking" });
  await bookingForm.getByLabel(/^Secrets/).click();
  await page.getByRole("option", { name: secretName }).click();
  await bookingForm.getByLabel(`as /run/secrets/${secretName}`).check();
  await bookingForm.getByLabel(`Variable for ${secretName}`).fill("E2E_TOKEN");
  await page.keyboard.press("Escape");
  await axeCheck(page, "availability-secrets");
  await page.getByRole("link", { name: "Secrets & registries" }).click();
  await page.getByRole("button", { name: `Delete secret ${secretName}` }).click();
  await page.getByRole("dialog", { name: "Delete this secret?" }).getByRole("button", { name: "Delete secret", exact: true }).click();
  await page.getByTestId(`secret-${secretName}`).waitFor({ state: "detached" });

  step("phone width still works");
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${BASE}/`);
  await page.getByTestId("project-demo").waitFor();
  await shot(page, "09-dashboard-phone");
  await page.getByRole("button", { name: "Toggle navigation" }).click();
  await page.getByRole("link", { name: "Usage" }).waitFor();
  await axeCheck(page, "dashboard-phone-nav-open");
  await page.setViewportSize({ width: 1366, height: 900 });

  step("tenants do not see operator pages");
  expect((await page.getByRole("link", { name: "Fleet health" }).count()) === 0, "no fleet link for tenants");
  await signOut(page);

  // --- operator -------------------------------------------------------------------------------------
  step("the operator signs in and sees fleet health");
  await signIn(page, operator);
  await page.goto(`${BASE}/fleet`);
  await page.getByTestId("heatmap").waitFor();
  await page.getByText("simulated").first().waitFor();
  await shot(page, "10-fleet");
  await axeCheck(page, "fleet");

  step("the operator drains a server");
  const row = page.locator('[data-testid^="server-"]').filter({ has: page.getByRole("button", { name: "Drain" }) }).first();
  const host = (await row.getAttribute("data-testid")).replace("server-", "");
  await row.getByRole("button", { name: "Drain" }).click();
  await page.getByLabel("Reason").fill("e2e: firmware update");
  await axeCheck(page, "fleet-drain-dialog");
  await page.getByRole("dialog").getByRole("button", { name: "Drain" }).click();
  await page.getByTestId(`server-${host}`).getByText("draining").waitFor();
  await shot(page, "11-fleet-drained");
  // Leave the demo fleet as it was found.
  await page.getByTestId(`server-${host}`).getByRole("button", { name: "Return to ready" }).click();
  await page.getByLabel("Reason").fill("e2e: done");
  await page.getByRole("dialog").getByRole("button", { name: "Return to ready" }).click();
  await page.getByTestId(`server-${host}`).getByText("ready").waitFor();

  step("join tokens");
  await page.getByRole("link", { name: "Join tokens" }).click();
  await page.getByLabel("Note").fill("e2e rack 1");
  await page.getByRole("button", { name: "Create join token" }).click();
  await page.getByText("Join token created").waitFor();
  await shot(page, "12-join-tokens");
  await axeCheck(page, "join-tokens");

  step("the operator sees every project ranked by waste");
  await page.getByRole("link", { name: "Efficiency" }).click();
  await page.getByRole("heading", { name: /All projects, ranked by waste/ }).waitFor();
  await page.getByTestId("efficiency-totals").waitFor();
  await axeCheck(page, "efficiency-operator");
});
