import { describe, expect, it } from "vitest";

import type { ContainerPort, WebApp } from "../api/types";
import { forwardCommand, isJupyter, newPortRow, portFieldName, portProblems, portRows, portsBody, webAppLines } from "./ports";

const jupyter: ContainerPort = { name: "jupyter", port: 8888, protocol: "http", path: "/lab", auth: "jupyter" };
const board: ContainerPort = { name: "tensorboard", port: 6006, protocol: "http", path: "/", auth: "none" };
const db: ContainerPort = { name: "db", port: 5432, protocol: "tcp", path: "/", auth: "none" };
const app = (p: ContainerPort): WebApp => ({ ...p, url: `http://r1-${p.name}.localhost:8001/` });

describe("portRows and portsBody", () => {
  it("carry a template's ports through the form unchanged, path and auth included", () => {
    const rows = portRows([jupyter, { name: "tensorboard", port: 6006, protocol: "http" }]);
    expect(rows.map((r) => r.name)).toEqual(["jupyter", "tensorboard"]);
    expect(new Set(rows.map((r) => r.key)).size).toBe(2);
    expect(portsBody(rows)).toEqual([
      { name: "jupyter", port: 8888, protocol: "http", path: "/lab", auth: "jupyter" },
      { name: "tensorboard", port: 6006, protocol: "http" },
    ]);
  });

  it("trims names, and reads an unknown protocol as http", () => {
    // An answer from a newer server may name a protocol this portal does not know.
    const rows = portRows([{ name: "x", port: 1, protocol: "udp" as "http" }]);
    expect(rows[0].protocol).toBe("http");
    expect(portsBody([newPortRow({ name: " api ", port: 8000, protocol: "https" })])).toEqual([
      { name: "api", port: 8000, protocol: "https" },
    ]);
    expect(portRows(undefined)).toEqual([]);
  });
});

describe("portProblems", () => {
  it("accepts good rows", () => {
    expect(portProblems(portRows([jupyter, board, db]))).toEqual([]);
    expect(portProblems([])).toEqual([]);
  });

  it("names the row of a bad name, the reserved name and a repeated name", () => {
    expect(portProblems([newPortRow({ name: "Jupyter", port: 1 })])[0]).toMatch(/^Port row 1: a name is a lowercase letter/);
    expect(portProblems([newPortRow({ name: "", port: 1 })])).toHaveLength(1);
    expect(portProblems([newPortRow({ name: "a".repeat(33), port: 1 })])).toHaveLength(1);
    expect(portProblems([newPortRow({ name: "a".repeat(32), port: 1 })])).toEqual([]);
    expect(portProblems([newPortRow({ name: "terminal", port: 1 })])[0]).toContain('"terminal" is the web terminal\'s');
    expect(portProblems([newPortRow({ name: "a", port: 1 }), newPortRow({ name: "a", port: 2 })])).toEqual([
      "Port row 2: the name a is taken by row 1.",
    ]);
  });

  it("names the row of a port out of range, missing or repeated", () => {
    for (const port of [0, 65536, 1.5, "" as const]) {
      expect(portProblems([newPortRow({ name: "a", port })])).toEqual(["Port row 1: the port is a number from 1 to 65535."]);
    }
    expect(portProblems([newPortRow({ name: "a", port: 65535 })])).toEqual([]);
    expect(portProblems([newPortRow({ name: "a", port: 80 }), newPortRow({ name: "b", port: 80 })])).toEqual([
      "Port row 2: port 80 is taken by row 1.",
    ]);
  });

  it("allows at most 16", () => {
    const rows = Array.from({ length: 17 }, (_, i) => newPortRow({ name: `p${i}`, port: 1000 + i }));
    expect(portProblems(rows)).toEqual(["At most 16 web ports."]);
    expect(portProblems(rows.slice(1))).toEqual([]);
  });
});

describe("portFieldName", () => {
  it("is the API's field name", () => {
    expect(portFieldName(0, "name")).toBe("container.ports.0.name");
    expect(portFieldName(3, "port")).toBe("container.ports.3.port");
  });
});

describe("webAppLines", () => {
  it("lists every declared port in order, with its app only while served over http", () => {
    const lines = webAppLines([board, jupyter, db], [app(jupyter), app(board)]);
    expect(lines.map((l) => [l.port.name, l.app?.url ?? null, l.jupyter])).toEqual([
      ["tensorboard", "http://r1-tensorboard.localhost:8001/", false],
      ["jupyter", "http://r1-jupyter.localhost:8001/", true],
      ["db", null, false],
    ]);
  });

  it("has no app while not ready (no access.web), and keeps a served app the ports do not list", () => {
    expect(webAppLines([jupyter], undefined).map((l) => l.app)).toEqual([null]);
    expect(webAppLines(undefined, [app(board)]).map((l) => l.port.name)).toEqual(["tensorboard"]);
    expect(webAppLines(undefined, undefined)).toEqual([]);
  });

  it("never opens a non-http port in the browser, even if listed", () => {
    const secure: ContainerPort = { ...board, name: "secure", protocol: "https" };
    expect(webAppLines([secure], [app(secure)])[0].app).toBeNull();
  });
});

describe("isJupyter and forwardCommand", () => {
  it("knows JupyterLab by its auth or its name", () => {
    expect(isJupyter(jupyter)).toBe(true);
    expect(isJupyter({ name: "lab", auth: "jupyter" })).toBe(true);
    expect(isJupyter({ name: "jupyter" })).toBe(true);
    expect(isJupyter(board)).toBe(false);
  });

  it("forwards the port with gpucp ssh", () => {
    expect(forwardCommand("6f1c", 5432)).toBe("gpucp ssh 6f1c -L 5432:localhost:5432");
  });
});
