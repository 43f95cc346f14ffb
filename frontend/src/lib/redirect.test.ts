import { describe, expect, it } from "vitest";

import { safeNext } from "./redirect";

const ORIGIN = "https://portal.example";

describe("safeNext", () => {
  it("returns to a path on this site, with its query and fragment", () => {
    expect(safeNext("/availability", ORIGIN)).toBe("/availability");
    expect(safeNext("/usage?project=demo#csv", ORIGIN)).toBe("/usage?project=demo#csv");
    expect(safeNext("/reservations/5f0c7a3e-0000-4000-8000-000000000000", ORIGIN)).toBe(
      "/reservations/5f0c7a3e-0000-4000-8000-000000000000",
    );
  });

  it.each([
    null,
    "",
    "https://evil.example/",
    "//evil.example/path",
    "/\\evil.example",
    "/\t/evil.example",
    "javascript:alert(1)",
    "availability",
    "/login",
    "/login?next=/usage",
  ])("refuses %j and goes to the dashboard", (next) => {
    expect(safeNext(next, ORIGIN)).toBe("/");
  });
});
