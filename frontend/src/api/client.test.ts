import { describe, expect, it } from "vitest";

import { ApiError, buildUrl, createClient, isClientError, isMissingEndpoint, parseErrorBody, readCookie } from "./client";

function jsonResponse(status: number, body: unknown): Response {
  return new Response(body === undefined ? null : JSON.stringify(body), {
    status,
    headers: { "Content-Type": "application/json" },
  });
}

describe("parseErrorBody", () => {
  it("reads the shared error shape", () => {
    const body = { error: { code: "quota_exceeded", message: "Not enough credits.", fields: { spec: ["too big"] } } };
    expect(parseErrorBody(409, body)).toEqual({ code: "quota_exceeded", message: "Not enough credits.", fields: { spec: ["too big"] } });
  });

  it("normalises single-string field messages to lists", () => {
    expect(parseErrorBody(400, { error: { code: "x", message: "m", fields: { a: "one" } } }).fields).toEqual({ a: ["one"] });
  });

  it("falls back to DRF's detail, then to a sentence for the status", () => {
    expect(parseErrorBody(403, { detail: "Nope." }).message).toBe("Nope.");
    expect(parseErrorBody(502, undefined)).toEqual({ code: "http_502", message: "The server is unreachable.", fields: {} });
    expect(parseErrorBody(418, "<html>")).toEqual({ code: "http_418", message: "The request failed (HTTP 418).", fields: {} });
  });
});

describe("cookies and urls", () => {
  it("reads one cookie among many", () => {
    expect(readCookie("a=1; csrftoken=abc%3D; b=2", "csrftoken")).toBe("abc=");
    expect(readCookie("a=1", "csrftoken")).toBeNull();
  });

  it("builds urls under /api/v1 and drops empty query values", () => {
    expect(buildUrl("/reservations/", { state: "running", project: undefined, x: "", n: 0 })).toBe("/api/v1/reservations/?state=running&n=0");
    expect(buildUrl("reservations/", { state: ["completed", "failed"] })).toBe("/api/v1/reservations/?state=completed&state=failed");
  });
});

describe("createClient", () => {
  it("sends the CSRF token from the cookie on writes, not on reads", async () => {
    const seen: { url: string; init?: RequestInit }[] = [];
    const fetchImpl = (async (url: string, init?: RequestInit) => {
      seen.push({ url, init });
      return jsonResponse(200, { ok: true });
    }) as unknown as typeof fetch;
    const client = createClient(fetchImpl, () => "csrftoken=tok123");
    await client.request("me/");
    await client.request("reservations/", { method: "POST", body: { a: 1 } });
    const get = seen[0].init!.headers as Record<string, string>;
    const post = seen[1].init!.headers as Record<string, string>;
    expect(get["X-CSRFToken"]).toBeUndefined();
    expect(post["X-CSRFToken"]).toBe("tok123");
    expect(post["Content-Type"]).toBe("application/json");
    expect(seen[1].init!.credentials).toBe("same-origin");
    expect(seen[1].init!.body).toBe('{"a":1}');
  });

  it("fetches auth/csrf first when the cookie is missing", async () => {
    let cookie = "";
    const urls: string[] = [];
    const fetchImpl = (async (url: string) => {
      urls.push(url);
      if (url.endsWith("auth/csrf/")) {
        cookie = "csrftoken=fresh";
        return jsonResponse(200, { csrf_token: "fresh" });
      }
      return jsonResponse(204, undefined);
    }) as unknown as typeof fetch;
    const client = createClient(fetchImpl, () => cookie);
    await client.request("auth/logout/", { method: "POST" });
    expect(urls).toEqual(["/api/v1/auth/csrf/", "/api/v1/auth/logout/"]);
  });

  it("throws ApiError carrying status, code and fields", async () => {
    const fetchImpl = (async () =>
      jsonResponse(400, { error: { code: "validation_error", message: "window.end: must be later.", fields: { "window.end": ["must be later."] } } })) as unknown as typeof fetch;
    const client = createClient(fetchImpl, () => "csrftoken=t");
    const err = await client.request<never>("reservations/", { method: "POST", body: {} }).catch((e: ApiError) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err.status).toBe(400);
    expect(err.code).toBe("validation_error");
    expect(err.message).toBe("window.end: must be later.");
    expect(err.fieldError("window.end")).toBe("must be later.");
    expect(isMissingEndpoint(err)).toBe(false);
  });

  it("a network failure becomes a readable ApiError; a 404 counts as a missing endpoint", async () => {
    const down = createClient((async () => { throw new TypeError("Failed to fetch"); }) as unknown as typeof fetch, () => "");
    const err = await down.request<never>("me/").catch((e: ApiError) => e);
    expect(err.message).toBe("The server could not be reached.");
    const missing = createClient((async () => jsonResponse(404, { error: { code: "not_found", message: "Not found.", fields: {} } })) as unknown as typeof fetch, () => "");
    expect(isMissingEndpoint(await missing.request("usage/report/").catch((e: ApiError) => e))).toBe(true);
  });
});

describe("isClientError", () => {
  it("is a 4xx ApiError only", () => {
    const err = (status: number) => new ApiError(status, { code: "x", message: "x", fields: {} });
    expect(isClientError(err(404))).toBe(true);
    expect(isClientError(err(400))).toBe(true);
    expect(isClientError(err(500))).toBe(false);
    expect(isClientError(err(0))).toBe(false);
    expect(isClientError(new Error("boom"))).toBe(false);
  });
});
