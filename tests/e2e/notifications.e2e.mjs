// Notifications (issue 14): the bell and its unread count, the list and preferences page, and a project's
// webhooks page for its owner: a loopback URL refused by the SSRF rule, an endpoint added with its secret, a test
// event in the delivery log, the secret rotated. Each page axe-checked. It deletes the endpoint it added.

import { BASE, axeCheck, expect, run, shot, signIn, step, tenant } from "./lib.mjs";

await run("notifications", async (page) => {
  await signIn(page, tenant);

  step("the header has a bell; its popover lists notifications and links to the page");
  const bell = page.getByTestId("notification-bell");
  await bell.waitFor();
  expect((await bell.getAttribute("aria-label"))?.startsWith("Notifications"), "the bell is named");
  await bell.click();
  await page.getByTestId("notification-list").waitFor();
  // Axe reads colours as drawn: wait for the list to load and the popover's fade-in to finish (under load a
  // half-transparent dropdown read as low contrast).
  await page.waitForFunction(() => {
    const list = document.querySelector('[data-testid="notification-list"]');
    const dropdown = list?.closest(".mantine-Popover-dropdown");
    return list && !list.textContent.includes("Loading") && dropdown && getComputedStyle(dropdown).opacity === "1";
  }, null, { timeout: 15_000 });
  await axeCheck(page, "notification-bell");
  await page.getByRole("link", { name: "All notifications and preferences" }).click();
  await page.getByRole("heading", { level: 1, name: "Notifications" }).waitFor();

  step("a preference is saved and read back");
  // By test id: the Select's listbox carries the same accessible name as its input.
  const booked = () => page.getByTestId("pref-reservation.booked");
  await booked().click();
  const saved = page.waitForResponse((r) => r.url().includes("/notifications/preferences/") && r.request().method() === "PUT");
  await page.getByRole("option", { name: "Email" }).click();
  await saved;
  await page.reload();
  await booked().waitFor();
  expect((await booked().inputValue()) === "Email", "booked is emailed now");
  await axeCheck(page, "notifications");
  await shot(page, "14-notifications");

  step("a loopback webhook URL is refused, naming the field (the SSRF rule)");
  await page.goto(`${BASE}/webhooks`);
  await page.getByRole("heading", { level: 1, name: "Webhooks" }).waitFor();
  await page.getByLabel("URL").fill("http://127.0.0.1:9/hook");
  await page.getByRole("button", { name: "Add endpoint" }).click();
  await page.getByText(/loopback, link-local, private or reserved/).first().waitFor();

  step("a public URL is added: its secret is shown, a test event lands in the delivery log, the secret rotates");
  await page.getByLabel("URL").fill("http://93.184.215.14/e2e-hook");
  await page.getByRole("button", { name: "Add endpoint" }).click();
  const card = page.getByRole("region", { name: "Webhook http://93.184.215.14/e2e-hook" });
  await card.waitFor();
  const secret = await card.locator("code").first().innerText();
  expect(secret.startsWith("whsec_"), `the secret is shown: ${secret}`);
  await card.getByRole("button", { name: "Send test event" }).click();
  await card.getByText("webhook.test").waitFor({ timeout: 15_000 });
  await card.getByRole("button", { name: "Rotate secret" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Rotate" }).click();
  await card.getByText(/The previous secret also signs until/).waitFor();
  expect((await card.locator("code").first().innerText()) !== secret, "a new secret");
  await axeCheck(page, "webhooks");
  await shot(page, "14-webhooks");

  step("the endpoint is deleted");
  await card.getByRole("button", { name: "Delete" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Delete" }).click();
  await card.waitFor({ state: "detached" });
});
