// The portal is a plain client of the public API: session cookie + CSRF header, one error shape.

export interface ErrorBody {
  code: string;
  message: string;
  fields: Record<string, string[]>;
}

/** An API answer other than 2xx, carrying the shared error shape {"error": {code, message, fields}}. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly fields: Record<string, string[]>;

  constructor(status: number, body: ErrorBody) {
    super(body.message);
    this.name = "ApiError";
    this.status = status;
    this.code = body.code;
    this.fields = body.fields;
  }

  /** The first message for a field, for showing under its input. */
  fieldError(name: string): string | undefined {
    return this.fields[name]?.join(" ");
  }

  get notFound(): boolean {
    return this.status === 404;
  }
}

/** A 4xx: the server understood and refused; asking the same again (a retry, a poll) gets the same answer. */
export function isClientError(err: unknown): boolean {
  return err instanceof ApiError && err.status >= 400 && err.status < 500;
}

const STATUS_TEXT: Record<number, string> = {
  400: "The request was not valid.",
  401: "You are not signed in.",
  403: "You are not allowed to do that.",
  404: "Not found.",
  409: "That conflicts with the current state.",
  429: "Too many requests; try again shortly.",
  500: "The server failed; try again or ask an operator.",
  502: "The server is unreachable.",
  503: "The server is unavailable.",
};

/** Turn any error body into the shared shape, so callers never branch on what the server sent. */
export function parseErrorBody(status: number, body: unknown): ErrorBody {
  const fallback = STATUS_TEXT[status] ?? `The request failed (HTTP ${status}).`;
  if (body && typeof body === "object" && "error" in body) {
    const err = (body as { error: unknown }).error;
    if (err && typeof err === "object") {
      const e = err as Partial<ErrorBody>;
      const fields: Record<string, string[]> = {};
      if (e.fields && typeof e.fields === "object") {
        for (const [k, v] of Object.entries(e.fields)) {
          fields[k] = Array.isArray(v) ? v.map(String) : [String(v)];
        }
      }
      return {
        code: typeof e.code === "string" ? e.code : `http_${status}`,
        message: typeof e.message === "string" && e.message ? e.message : fallback,
        fields,
      };
    }
  }
  // DRF's default {"detail": "..."} if some view bypasses the shared handler.
  if (body && typeof body === "object" && "detail" in body) {
    return { code: `http_${status}`, message: String((body as { detail: unknown }).detail), fields: {} };
  }
  return { code: `http_${status}`, message: fallback, fields: {} };
}

export function readCookie(cookieHeader: string, name: string): string | null {
  for (const part of cookieHeader.split(";")) {
    const [k, ...rest] = part.trim().split("=");
    if (k === name) return decodeURIComponent(rest.join("="));
  }
  return null;
}

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);
export const API_ROOT = "/api/v1/";

export type Query = Record<string, string | number | boolean | null | undefined | readonly (string | number)[]>;

export function buildUrl(path: string, query?: Query): string {
  const clean = path.replace(/^\/+/, "");
  const url = API_ROOT + clean;
  if (!query) return url;
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v === undefined || v === null || v === "") continue;
    // A list is the key repeated (?state=a&state=b), as the API's multiple-choice filters read it.
    if (Array.isArray(v)) for (const item of v) params.append(k, String(item));
    else params.set(k, String(v));
  }
  const qs = params.toString();
  return qs ? `${url}?${qs}` : url;
}

export interface RequestOptions {
  method?: string;
  query?: Query;
  body?: unknown;
  signal?: AbortSignal;
}

type FetchLike = typeof fetch;

/** A fetch wrapper; `fetchImpl` and `cookies` are injectable so the logic is tested without a browser. */
export function createClient(fetchImpl: FetchLike, cookies: () => string) {
  async function ensureCsrf(): Promise<string> {
    let token = readCookie(cookies(), "csrftoken");
    if (!token) {
      // GET auth/csrf sets the cookie; the body carries it too, for when the cookie is not readable yet.
      const res = await fetchImpl(buildUrl("auth/csrf/"), { credentials: "same-origin" });
      const body = (await res.json().catch(() => ({}))) as { csrf_token?: string };
      token = readCookie(cookies(), "csrftoken") ?? body.csrf_token ?? "";
    }
    return token;
  }

  async function request<T>(path: string, opts: RequestOptions = {}): Promise<T> {
    const method = (opts.method ?? "GET").toUpperCase();
    const headers: Record<string, string> = { Accept: "application/json" };
    if (!SAFE_METHODS.has(method)) headers["X-CSRFToken"] = await ensureCsrf();
    let body: string | undefined;
    if (opts.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(opts.body);
    }
    let res: Response;
    try {
      res = await fetchImpl(buildUrl(path, opts.query), {
        method,
        headers,
        body,
        credentials: "same-origin",
        signal: opts.signal,
      });
    } catch (e) {
      if ((e as Error).name === "AbortError") throw e;
      throw new ApiError(0, { code: "network", message: "The server could not be reached.", fields: {} });
    }
    if (res.status === 204) return undefined as T;
    const text = await res.text();
    let parsed: unknown = undefined;
    if (text) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined;
      }
    }
    if (!res.ok) throw new ApiError(res.status, parseErrorBody(res.status, parsed));
    return parsed as T;
  }

  return { request, ensureCsrf };
}

const browserClient = createClient(
  (...args) => fetch(...args),
  () => (typeof document === "undefined" ? "" : document.cookie),
);

export const api = {
  get: <T>(path: string, query?: Query, signal?: AbortSignal) => browserClient.request<T>(path, { query, signal }),
  post: <T>(path: string, body?: unknown) => browserClient.request<T>(path, { method: "POST", body: body ?? {} }),
  put: <T>(path: string, body?: unknown) => browserClient.request<T>(path, { method: "PUT", body: body ?? {} }),
  patch: <T>(path: string, body?: unknown) => browserClient.request<T>(path, { method: "PATCH", body: body ?? {} }),
  del: <T>(path: string) => browserClient.request<T>(path, { method: "DELETE" }),
  ensureCsrf: () => browserClient.ensureCsrf(),
};

/** The largest page the API serves (`limit`, core/api/pagination.py); asking for more is a 400. */
export const MAX_PAGE = 500;

/** Every item of a paged list, page after page (`limit` = MAX_PAGE): for lists a page shows whole, such as the
 * fleet's servers. Stops at `max` items, so a very large fleet costs a bounded number of requests. */
export async function getAll<T>(path: string, query: Query = {}, max = 20 * MAX_PAGE): Promise<T[]> {
  const items: T[] = [];
  for (let offset = 0; items.length < max; offset += MAX_PAGE) {
    const page = await api.get<{ results: T[]; next: string | null }>(path, { ...query, limit: MAX_PAGE, offset });
    items.push(...page.results);
    if (!page.next || page.results.length === 0) break;
  }
  return items;
}

/** Endpoints still being built answer 404 at their route; the portal shows "not available yet" then. */
export function isMissingEndpoint(err: unknown): boolean {
  return err instanceof ApiError && (err.status === 404 || err.status === 405);
}
