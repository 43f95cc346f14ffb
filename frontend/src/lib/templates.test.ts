import { describe, expect, it } from "vitest";

import type { LaunchTemplate } from "../api/types";
import { templateFill, templateLabel } from "./templates";

const pytorch: LaunchTemplate = {
  project: null,
  name: "pytorch",
  title: "PyTorch (NVIDIA NGC)",
  description: "",
  container: { image: "nvcr.io/nvidia/pytorch:25.01-py3", command: ["sleep", "infinity"], env: {}, secrets: [], volumes: [], network: "none" },
  spec: { min_memory_mib: 16384, gpu_count: 1 },
  ports: [{ name: "jupyter", port: 8888, protocol: "http", path: "/lab", auth: "jupyter" }],
  duration: 4 * 3600,
};

describe("templateFill", () => {
  it("fills the image, the command, the count and the end from the template's length", () => {
    const start = Date.parse("2026-05-01T14:00:00Z");
    expect(templateFill(pytorch, start)).toEqual({
      name: "pytorch",
      image: "nvcr.io/nvidia/pytorch:25.01-py3",
      command: "sleep infinity",
      model: null,
      count: 1,
      ports: [{ name: "jupyter", port: 8888, protocol: "http", path: "/lab", auth: "jupyter" }],
      end: Date.parse("2026-05-01T18:00:00Z"),
    });
  });

  it("takes the model where the spec names one, and leaves the count when it gives none", () => {
    const t = { ...pytorch, spec: { gpu_model: "H100-80GB" } };
    const fill = templateFill(t, 0);
    expect(fill.model).toBe("H100-80GB");
    expect(fill.count).toBeNull();
    expect(templateFill({ ...pytorch, spec: null }, 0).model).toBeNull();
  });
});

describe("templateLabel", () => {
  it("says whose the template is", () => {
    expect(templateLabel(pytorch)).toBe("PyTorch (NVIDIA NGC) (pytorch, operator)");
    expect(templateLabel({ ...pytorch, project: "atlas", title: "" })).toBe("pytorch (pytorch, atlas)");
  });
});
