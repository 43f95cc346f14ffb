// A reservation's web apps and web terminal in the browser (docs/proxy.md, docs/portal.md "Web apps and the
// terminal"), in headless Chromium against a running system whose agents run Docker and their SSH gateways: the
// tenant books JupyterLab from the booking form (the shipped jupyterlab template, on the local lab image),
// opens it from the reservation page signed in, runs a cell over the kernel's WebSocket, uploads a file through
// the lab and downloads it back; someone outside the project gets 404 on the app's address; the web terminal
// shows the reservation's GPUs; releasing the reservation closes the kernel's socket and the terminal, and the lab
// answers 410. Run by tests/e2e/test_portal_web_apps.py (it needs Docker and the image gpucp-jupyter:test).

import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { ARTIFACTS, BASE, apiSession, axeCheck, browserContext, expect, operator, run, shot, signIn, step, tenant } from "./lib.mjs";

const IMAGE = process.env.JUPYTER_IMAGE ?? "gpucp-jupyter:test";
// Creating the container is slow on some storage drivers, and the lab takes its time to listen once it runs.
const START_TIMEOUT_MS = Number(process.env.START_TIMEOUT_S ?? 180) * 1000;
const LAB_TIMEOUT_MS = Number(process.env.LAB_TIMEOUT_S ?? 150) * 1000;
const UUID = /^[0-9a-f-]{36}$/;

/** Whether the tab shows JupyterLab's own page (its config block), not the proxy's "did not answer". */
async function labServed(tab) {
  return (await tab.locator("#jupyter-config-data").count()) > 0;
}

/** In a page: the body of a GET of `url` from it (with its cookies), in base64; empty unless 200. */
async function fetchBase64(url) {
  const answer = await fetch(url, { cache: "no-store" });
  if (answer.status !== 200) return "";
  const bytes = new Uint8Array(await answer.arrayBuffer());
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

/** `promise`, or a failure naming `what` after `ms`. */
function within(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`not within ${ms / 1000}s: ${what}`)), ms)));
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

await run("webapps", async (page, context) => {
  step("the tenant picks the JupyterLab template in the booking form: its web port signs in to the lab");
  await signIn(page, tenant);
  await page.goto(`${BASE}/availability`);
  await page.getByTestId("timeline").waitFor();
  await page.getByLabel("Start now").check();
  await page.getByRole("textbox", { name: "Template" }).click();
  await page.getByRole("option", { name: /\(jupyterlab, operator\)$/ }).click();
  const ports = page.getByTestId("port-fields");
  const row = ports.getByTestId("port-row-0");
  await row.getByText("signed in to JupyterLab").waitFor();
  expect((await row.getByLabel("Name", { exact: true }).inputValue()) === "jupyter", "the template's port is named jupyter");
  expect((await row.getByLabel("Port", { exact: true }).inputValue()) === "8888", "the template's port is 8888");
  expect(/opens at \/lab/.test(await row.innerText()), `the row says where Open lands: ${await row.innerText()}`);
  expect((await row.getByLabel("Sign-in", { exact: true }).inputValue()) === "jupyter", "the template's port signs in");
  expect((await ports.getByTestId("port-row-1").count()) === 0, "one web port");

  step(`the tenant books 1 GPU on ${IMAGE} (the image's own command starts the lab)`);
  await page.getByLabel("Container image").fill(IMAGE);
  expect((await page.getByLabel("Command").inputValue()) === "", "no command: the image's default serves the lab");
  await page.getByLabel("GPUs", { exact: true }).fill("1");
  await page.getByTestId("free-line").waitFor();
  await shot(page, "webapps-01-booking");
  await page.getByRole("button", { name: /^Book 1 GPU$/ }).click();
  await page.waitForURL(/\/reservations\/[0-9a-f-]{36}$/);
  const id = page.url().split("/").pop();
  expect(UUID.test(id), `the reservation's page: ${page.url()}`);

  step("the reservation runs, and the Web apps card offers Open JupyterLab");
  await page.waitForFunction(
    () => document.querySelector('[data-testid="state-badge"]')?.textContent.trim().toLowerCase() === "running",
    null,
    { timeout: START_TIMEOUT_MS, polling: 500 },
  );
  const apps = page.getByTestId("web-apps");
  const openLab = apps.getByTestId("web-app-jupyter").getByRole("button", { name: "Open JupyterLab" });
  await openLab.waitFor({ timeout: 60_000 });
  await shot(page, "webapps-02-running");
  await axeCheck(page, "reservation-web-apps");

  step("Open JupyterLab: a new tab signs in on the app's own host and lands on /lab");
  const [lab] = await Promise.all([context.waitForEvent("page"), openLab.click()]);
  const appHost = `${id}-jupyter.localhost`;
  await lab.waitForURL((u) => u.hostname === appHost && u.pathname === "/lab", { timeout: 30_000 });
  const appOrigin = new URL(lab.url()).origin;
  expect(!lab.url().includes("token"), `no token in the address bar: ${lab.url()}`);
  // Every kernel socket the lab opens (the window's end must close it), and the first kernel_info_reply on one:
  // the lab runs a cell only once its kernel connection has that answer.
  const kernelSockets = [];
  let kernelAnswered;
  const kernelReady = new Promise((resolve) => (kernelAnswered = resolve));
  lab.on("websocket", (ws) => {
    if (!/\/api\/kernels\/[^/]+\/channels/.test(ws.url())) return;
    const entry = { ws, url: ws.url(), frames: 0 };
    ws.on("framereceived", (f) => {
      entry.frames++;
      if (String(f.payload).includes('"msg_type": "kernel_info_reply"')) kernelAnswered();
    });
    kernelSockets.push(entry);
  });
  const labErrors = [];
  lab.on("pageerror", (e) => labErrors.push(String(e)));

  step("the lab answers once it listens in its container (the proxy says 502 until then)");
  const labDeadline = Date.now() + LAB_TIMEOUT_MS;
  while (!(await labServed(lab))) {
    expect(Date.now() < labDeadline, `the lab answered within ${LAB_TIMEOUT_MS / 1000}s: ${await lab.locator("body").innerText()}`);
    const why = await lab.locator("h1").first().innerText().catch(() => "");
    expect(/did not answer|could not be reached|Not running yet/.test(why), `only "not listening yet" is waited out: ${why}`);
    await lab.waitForTimeout(2000);
    await lab.reload();
  }
  const launcherNotebook = lab.locator('.jp-LauncherCard[data-category="Notebook"]').first();
  await launcherNotebook.waitFor({ timeout: LAB_TIMEOUT_MS });
  expect(!(await lab.getByText("Token authentication is enabled").count()), "no token asked for");
  await shot(lab, "webapps-03-lab");

  step("a notebook from the launcher runs print(6*7) over the kernel's WebSocket: 42");
  await launcherNotebook.click();
  const notebook = lab.locator(".jp-NotebookPanel:not(.lm-mod-hidden)");
  const editor = notebook.locator(".jp-Cell .cm-content").first();
  await editor.waitFor({ timeout: 60_000 });
  await within(kernelReady, 90_000, "the kernel answered kernel_info over its WebSocket");
  await lab.locator("#jp-main-statusbar").getByText("Python 3 (ipykernel) | Idle").waitFor({ timeout: 30_000 });
  await editor.click();
  await lab.keyboard.type("print(6*7)");
  expect((await editor.innerText()).trim() === "print(6*7)", `the cell holds the code: ${await editor.innerText()}`);
  await lab.keyboard.press("Shift+Enter");
  const output = notebook.locator(".jp-OutputArea-output").first();
  await output.waitFor({ timeout: 60_000 });
  await lab.waitForFunction((el) => el.textContent.trim() === "42", await output.elementHandle(), { timeout: 30_000 });
  const described = (sockets) => JSON.stringify(sockets.map((s) => ({ url: s.url, frames: s.frames, closed: s.ws.isClosed() })));
  expect(kernelSockets.some((s) => !s.ws.isClosed() && s.frames > 0), `the kernel talks over an open WebSocket: ${described(kernelSockets)}`);
  await shot(lab, "webapps-04-notebook");

  step("a file uploaded through the lab's file browser comes back byte for byte");
  // Over a megabyte, so the lab sends it in chunks (one request each), all through the proxy.
  const upload = { name: `e2e-upload-${Date.now()}.bin`, mimeType: "application/octet-stream", buffer: randomBytes(1_500_000) };
  const [chooser] = await Promise.all([
    lab.waitForEvent("filechooser"),
    lab.locator('.jp-FileBrowser [data-jp-item-name="uploader"] .jp-ToolbarButtonComponent').click(),
  ]);
  await chooser.setFiles(upload);
  await lab.locator(".jp-DirListing-item", { hasText: upload.name }).waitFor({ timeout: 60_000 });
  // The listing shows the file once its first chunk is written: wait for the last.
  let back = Buffer.alloc(0);
  const uploadDeadline = Date.now() + 60_000;
  for (;;) {
    back = Buffer.from(await lab.evaluate(fetchBase64, `/files/${upload.name}`), "base64");
    if (back.length >= upload.buffer.length || Date.now() > uploadDeadline) break;
    await lab.waitForTimeout(500);
  }
  expect(back.equals(upload.buffer), `the download is the upload: ${back.length} of ${upload.buffer.length} bytes, equal ${back.equals(upload.buffer)}`);
  // And as the browser downloads it from the file browser's menu.
  await lab.locator(".jp-DirListing-item", { hasText: upload.name }).click({ button: "right" });
  const [download] = await Promise.all([
    lab.waitForEvent("download"),
    lab.locator(".lm-Menu-item", { hasText: /^Download$/ }).first().click(),
  ]);
  const saved = join(ARTIFACTS, "webapps-download.bin");
  await download.saveAs(saved);
  expect(readFileSync(saved).equals(upload.buffer), "the file browser's download is the upload");
  await shot(lab, "webapps-05-uploaded");

  step("someone not in the project gets 404 on the app's address, signed in to the portal or not");
  const other = await browserContext();
  try {
    const stranger = await other.context.newPage();
    const blank = await stranger.goto(`${appOrigin}/lab`);
    expect(blank.status() === 404, `a browser without the app's cookie: ${blank.status()}`);
    await signIn(stranger, operator);
    const signedIn = await stranger.goto(`${appOrigin}/lab`);
    expect(signedIn.status() === 404, `${operator.user}, in no project, on the app's address: ${signedIn.status()}`);
    expect(/open it from its reservation in the portal/.test(await stranger.locator("body").innerText()), "the 404 says how to open an app");
    expect(!(await labServed(stranger)), "nothing of the lab reaches the stranger");
    const api = await apiSession(operator);
    const link = await api("POST", `reservations/${id}/open/`, { port: "jupyter" });
    expect(link.status === 404, `${operator.user} gets no link to the app: ${link.status} ${JSON.stringify(link.data)}`);
    await shot(stranger, "webapps-06-stranger-404");
  } finally {
    await other.close();
  }

  step("the web terminal shows the reservation's GPUs");
  await page.bringToFront();
  const launches = await page.evaluate(async (rid) => (await fetch(`/api/v1/reservations/${rid}/launches/`)).json(), id);
  const uuids = (launches.results ?? launches).flatMap((l) => l.gpu_uuids ?? []);
  expect(uuids.length === 1, `one GPU in the launch: ${JSON.stringify(launches)}`);
  await page.getByTestId("terminal-button").click();
  const status = page.getByTestId("terminal-status");
  await page.locator('[data-testid="terminal-status"][data-state="open"]').waitFor({ timeout: 60_000 });
  const terminal = page.getByTestId("web-terminal");
  const rows = terminal.locator(".xterm-rows");
  // The shell's prompt first, so the keys go to a shell that reads them.
  await page.waitForFunction((el) => el.textContent.trim().length > 0, await rows.elementHandle(), { timeout: 30_000 });
  await terminal.locator(".xterm-helper-textarea").focus();
  await page.keyboard.type("echo $NVIDIA_VISIBLE_DEVICES");
  await page.keyboard.press("Enter");
  await page.waitForFunction(
    ([el, want]) => want.every((u) => el.textContent.includes(u)),
    [await rows.elementHandle(), uuids],
    { timeout: 30_000 },
  );
  await shot(page, "webapps-07-terminal");
  await axeCheck(page, "reservation-terminal");

  step("the tenant releases the reservation: the lab's kernel socket and the terminal close, the lab answers 410");
  const openKernelSockets = kernelSockets.filter((s) => !s.ws.isClosed());
  expect(openKernelSockets.length > 0, "a kernel socket is open before the release");
  await page.getByRole("button", { name: "Release now" }).click();
  await page.getByRole("dialog", { name: "Release the GPUs now?" }).getByRole("button", { name: "Release the GPUs" }).click();
  await page.locator('[data-testid="terminal-status"][data-state="closed"]').waitFor({ timeout: 60_000 });
  const code = Number(await status.getAttribute("data-code"));
  // The proxy closes it for the window's end, or finds the window ended when the gateway ends the shell first.
  expect(code === 4410, `the terminal closed for the window's end: ${code} ${await status.innerText()}`);
  for (const s of openKernelSockets) {
    if (!s.ws.isClosed()) await s.ws.waitForEvent("close", { timeout: 30_000 });
  }
  const gone = await lab.reload();
  expect(gone.status() === 410, `the lab after the window: ${gone.status()}`);
  expect(/has closed/.test(await lab.locator("h1").innerText()), `the 410 page says so: ${await lab.locator("body").innerText()}`);
  await shot(lab, "webapps-08-lab-gone");
  await page.getByTestId("web-app-jupyter").getByText("Closed with the reservation.").waitFor();

  step("the reservation's events name both openings, each with its SSH session through the proxy");
  await page.getByText(`${tenant.user} opened the app jupyter in the browser`).first().waitFor();
  await page.getByText(`${tenant.user} opened the web terminal in the browser`).first().waitFor();
  // The gateway's own session events come with the agent's heartbeats.
  await page.getByText(`opened by ${tenant.user} through the web proxy`).nth(1).waitFor({ timeout: 60_000 });
  await shot(page, "webapps-09-released");
  expect(labErrors.length === 0, `no uncaught errors in the lab: ${labErrors.join(" | ")}`);
});
