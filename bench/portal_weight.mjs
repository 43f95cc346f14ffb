// The browser half of bench/portal_weight.py: loads each portal page with a fresh cache, signed out and signed
// in, and prints one JSON line per load with the bytes that crossed the wire. Each page is loaded twice in the
// same run: as served (the browser accepts br/gzip) and, as the baseline, with compression refused
// (Accept-Encoding: identity).
//
// Environment: PORTAL_URL, TENANT_USER/TENANT_PASSWORD, OPERATOR_USER/OPERATOR_PASSWORD, CHROMIUM, PAGES (JSON).

import { mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(resolve(here, "../frontend"), "package.json"));
const { chromium } = require("playwright-core");

const BASE = process.env.PORTAL_URL;
const users = {
  tenant: { user: process.env.TENANT_USER ?? "alice", password: process.env.TENANT_PASSWORD },
  operator: { user: process.env.OPERATOR_USER ?? "operator", password: process.env.OPERATOR_PASSWORD },
};
const pages = JSON.parse(process.env.PAGES);

const profile = mkdtempSync(join(tmpdir(), "portal-weight-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  viewport: { width: 1440, height: 900 },
});
context.setDefaultTimeout(30_000);
const page = await context.newPage();
const cdp = await context.newCDPSession(page);
await cdp.send("Network.enable");

// Bytes on the wire per request, from Chromium's own count (headers and body as received, compressed or not).
let wire = new Map();
cdp.on("Network.responseReceived", (e) => {
  const r = wire.get(e.requestId);
  if (r) Object.assign(r, { status: e.response.status, encoding: e.response.headers["content-encoding"] ?? e.response.headers["Content-Encoding"] ?? "" });
});
cdp.on("Network.requestWillBeSent", (e) => wire.set(e.requestId, { url: e.request.url, bytes: 0, body: 0 }));
cdp.on("Network.dataReceived", (e) => { const r = wire.get(e.requestId); if (r) r.body += e.dataLength; });
cdp.on("Network.loadingFinished", (e) => { const r = wire.get(e.requestId); if (r) r.bytes = e.encodedDataLength; });

async function signIn(who) {
  await page.goto(`${BASE}/login`);
  await page.getByLabel("Username").fill(who.user);
  await page.getByLabel("Password").fill(who.password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator('[data-testid="signed-in-as"]').waitFor();
}

async function load(name, path, as, encoding) {
  await cdp.send("Network.clearBrowserCache");
  await cdp.send("Network.setExtraHTTPHeaders", { headers: encoding ? { "Accept-Encoding": encoding } : {} });
  wire = new Map();
  await page.goto(`${BASE}${path}`, { waitUntil: "networkidle" });
  await page.waitForTimeout(300);
  const requests = [...wire.values()];
  const total = requests.reduce((s, r) => s + r.bytes, 0);
  const assets = requests.filter((r) => !new URL(r.url).pathname.startsWith("/api/"));
  console.log(JSON.stringify({
    page: name, path, as, encoding: encoding ?? "br, gzip (as served)",
    bytes: total, requests: requests.length,
    asset_bytes: assets.reduce((s, r) => s + r.bytes, 0),
    api_bytes: total - assets.reduce((s, r) => s + r.bytes, 0),
    files: requests.map((r) => ({ path: new URL(r.url).pathname, bytes: r.bytes, encoding: r.encoding ?? "" })),
  }));
}

try {
  for (const as of ["signed-out", "tenant", "operator"]) {
    if (as !== "signed-out") await signIn(users[as]);
    for (const p of pages.filter((x) => (as === "signed-out" ? true : x.as === as))) {
      for (const encoding of [undefined, "identity"]) await load(p.name, p.path, as, encoding);
    }
    if (as !== "signed-out") {
      await cdp.send("Network.setExtraHTTPHeaders", { headers: {} });
      await page.getByRole("button", { name: "Sign out" }).click();
      await page.waitForURL(/\/login/);
    }
  }
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
