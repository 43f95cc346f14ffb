// The sign-in page returns the visitor to the page they asked for (docs/portal.md), and only on this site.

/**
 * Where to go after sign-in: the `next` the visitor was sent here with, when it is a path on this site (an
 * absolute URL, `//host`, `/\\host` or anything that resolves to another origin is refused: no open redirect);
 * otherwise the dashboard.
 */
export function safeNext(next: string | null | undefined, origin: string = window.location.origin): string {
  if (!next || !next.startsWith("/") || next.startsWith("//") || next.startsWith("/\\")) return "/";
  let url: URL;
  try {
    url = new URL(next, origin);
  } catch {
    return "/";
  }
  if (url.origin !== origin || url.pathname === "/login") return "/";
  return url.pathname + url.search + url.hash;
}
