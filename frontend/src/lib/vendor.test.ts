import { describe, expect, it } from "vitest";

import { migSummary, parseMigLayout, vendorLabel } from "./vendor";

const device = (profile: string) => ({
  uuid: `MIG-${profile}`, profile, memory_mib: 1, compute_slices: 1, memory_slices: 1, placement_start: 0,
});

describe("vendorLabel", () => {
  it("names the vendor of a server's GPUs", () => {
    expect(vendorLabel([{ vendor: "amd" }, { vendor: "amd" }])).toBe("AMD");
    expect(vendorLabel([{ vendor: "nvidia" }])).toBe("NVIDIA");
  });
  it("does not hide a mixed server", () => {
    expect(vendorLabel([{ vendor: "nvidia" }, { vendor: "amd" }])).toBe("NVIDIA + AMD");
  });
});

describe("migSummary", () => {
  it("is null for a GPU without MIG", () => {
    expect(migSummary({ mig_mode: null, mig_devices: [] })).toBeNull();
  });
  it("lists the profiles of an enabled GPU", () => {
    const gpu = { mig_mode: { current: true, pending: true }, mig_devices: [device("3g.40gb"), device("2g.20gb")] };
    expect(migSummary(gpu)).toBe("MIG: 2g.20gb + 3g.40gb");
  });
  it("says when a mode change waits for a reset", () => {
    expect(migSummary({ mig_mode: { current: false, pending: true }, mig_devices: [] })).toBe("MIG off (on after reset)");
    expect(migSummary({ mig_mode: { current: true, pending: true }, mig_devices: [] })).toBe("MIG: no instances");
  });
});

describe("parseMigLayout", () => {
  it("reads profiles joined by + with counts", () => {
    expect(parseMigLayout("3g.40gb+2x1g.10gb")).toEqual(["3g.40gb", "1g.10gb", "1g.10gb"]);
  });
  it("keeps a media extension with its profile", () => {
    expect(parseMigLayout("1g.10gb+me+3g.40gb")).toEqual(["1g.10gb+me", "3g.40gb"]);
  });
  it("reads nothing as no instances", () => {
    expect(parseMigLayout(" ")).toEqual([]);
  });
});
