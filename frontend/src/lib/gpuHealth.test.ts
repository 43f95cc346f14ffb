import { describe, expect, it } from "vitest";

import { contrast as contrastRatio } from "./contrast";
import { explainReason, heatCell, reasonList } from "./gpuHealth";

describe("gpu health", () => {
  it("explains an XID in a line, and one it does not know says where to look", () => {
    expect(explainReason("xid:79")).toBe("XID 79: GPU has fallen off the bus: it stopped answering the host; reseat or power-cycle it");
    expect(explainReason("xid:4242")).toMatch(/^XID 4242: .*catalogue/);
  });

  it("shows the temperature behind the reason, and the limit when known", () => {
    expect(explainReason("temperature", 96.4, 90)).toBe("temperature: 96 °C now, over the limit of 90 °C; clears by itself when it cools down");
    expect(explainReason("temperature", null)).toMatch(/no reading now/);
  });

  it("reads any shape of reasons", () => {
    expect(reasonList(["xid:79", "temperature"])).toEqual(["xid:79", "temperature"]);
    expect(reasonList(null)).toEqual([]);
    expect(reasonList("missing")).toEqual(["missing"]);
  });

  it("every heatmap cell's text has at least 4.5:1 contrast, and idle is not green", () => {
    for (const scale of ["util", "temp"] as const) {
      for (let v = 0; v <= 100; v += 5) {
        const c = heatCell(v, 100, scale);
        expect(contrastRatio(c.rgb, c.text)).toBeGreaterThanOrEqual(4.5);
      }
      expect(contrastRatio(heatCell(null, 100, scale).rgb, heatCell(null, 100, scale).text)).toBeGreaterThanOrEqual(4.5);
    }
    const [r, g, b] = heatCell(0, 100, "util").rgb;
    expect(g > r + 20 && g > b + 20).toBe(false);
  });
});
