import { describe, expect, it } from "vitest";

import { portalPath } from "./NotificationBell";

describe("portalPath", () => {
  it("keeps a link's path and query so a click stays in the portal", () => {
    expect(portalPath("http://127.0.0.1:8000/reservations/abc?x=1")).toBe("/reservations/abc?x=1");
  });
  it("falls back to the notifications page for a link it cannot read", () => {
    expect(portalPath("")).toBe("/notifications");
  });
});
