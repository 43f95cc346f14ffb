import { describe, expect, it } from "vitest";

import { ApiError } from "./client";
import { pollUnlessRefused } from "./hooks";

describe("pollUnlessRefused", () => {
  const poll = pollUnlessRefused(3000);
  const failed = (status: number) => ({ state: { error: new ApiError(status, { code: "x", message: "x", fields: {} }) } });

  it("polls while the query succeeds or fails in a way that may pass", () => {
    expect(poll({ state: { error: null } })).toBe(3000);
    expect(poll(failed(503))).toBe(3000);
    expect(poll(failed(0))).toBe(3000);
  });

  it("stops once the server refused (an unknown reservation is asked once)", () => {
    expect(poll(failed(404))).toBe(false);
    expect(poll(failed(403))).toBe(false);
  });
});
