import { describe, expect, it } from "vitest";

import { appendLog, atBottom, followUrl, type LogEvent, pullText } from "./logs";

function ev(text: string, extra: Partial<LogEvent> = {}): LogEvent {
  return { server: "gpu-1", launch_id: "L1", generation: 1, offset: 0, cut: 0, text, ...extra };
}

describe("appendLog", () => {
  it("appends each container's output in order and keeps containers apart", () => {
    let out = appendLog([], ev("a\n"));
    out = appendLog(out, ev("x\n", { launch_id: "L2", server: "gpu-2" }));
    out = appendLog(out, ev("b\n"));
    expect(out.map((o) => [o.server, o.text])).toEqual([
      ["gpu-1", "a\nb\n"],
      ["gpu-2", "x\n"],
    ]);
  });

  it("counts what was dropped before the first text and the holes after it", () => {
    let out = appendLog([], ev("late\n", { cut: 500 }));
    expect(out[0]).toMatchObject({ dropped: 500, holes: 0 });
    out = appendLog(out, ev("later\n", { cut: 20 }));
    expect(out[0]).toMatchObject({ dropped: 520, holes: 1, text: "late\nlater\n" });
  });

  it("keeps at most max characters, the newest, and says how many went", () => {
    let out = appendLog([], ev("0123456789"), 8);
    out = appendLog(out, ev("abc"), 8);
    expect(out[0].text).toBe("56789abc");
    expect(out[0].dropped).toBe(5);
  });

  it("does not change the array it was given", () => {
    const first = appendLog([], ev("a"));
    appendLog(first, ev("b"));
    expect(first[0].text).toBe("a");
  });
});

describe("atBottom", () => {
  it("is true at the bottom and false once scrolled up", () => {
    expect(atBottom({ scrollTop: 700, clientHeight: 300, scrollHeight: 1000 })).toBe(true);
    expect(atBottom({ scrollTop: 400, clientHeight: 300, scrollHeight: 1000 })).toBe(false);
  });
});

describe("followUrl", () => {
  it("quotes the id", () => {
    expect(followUrl("/api/v1/", "a/b")).toBe("/api/v1/reservations/a%2Fb/logs/?follow=1");
  });
});

describe("pullText", () => {
  it("says layers, bytes and seconds", () => {
    expect(pullText({ layers_done: 3, layers_total: 7, bytes_done: 120e6, bytes_total: 480e6, seconds: 11.6 })).toBe(
      "3 of 7 layers, 120.0 MB of 480.0 MB, 12 s",
    );
  });
  it("leaves bytes out while the engine has not said the total", () => {
    expect(pullText({ layers_done: 0, layers_total: 2, bytes_done: 0, bytes_total: 0, seconds: 0.2 })).toBe(
      "0 of 2 layers, 0 s",
    );
  });
});
