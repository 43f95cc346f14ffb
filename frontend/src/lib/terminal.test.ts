import { describe, expect, it } from "vitest";

import { binaryBytes, canReconnect, closeText, keyBytes, resizeFrame, socketUrl } from "./terminal";

describe("frames", () => {
  it("sends a resize as the JSON the proxy reads", () => {
    expect(JSON.parse(resizeFrame(120, 40))).toEqual({ type: "resize", cols: 120, rows: 40 });
  });

  it("sends typed text as UTF-8 bytes", () => {
    expect(Array.from(keyBytes("ls\r"))).toEqual([0x6c, 0x73, 0x0d]);
    expect(Array.from(keyBytes("é"))).toEqual([0xc3, 0xa9]);
    expect(Array.from(keyBytes("\x03"))).toEqual([3]);
  });

  it("sends xterm's binary strings byte for byte", () => {
    expect(Array.from(binaryBytes("\x1b[M\xff\x80"))).toEqual([0x1b, 0x5b, 0x4d, 0xff, 0x80]);
  });
});

describe("socketUrl", () => {
  it("keeps a ws URL, and makes a path or an http URL a WebSocket URL", () => {
    const page = "https://portal.example/reservations/1";
    expect(socketUrl("ws://localhost:8001/_gpucp/terminal?token=a", page)).toBe("ws://localhost:8001/_gpucp/terminal?token=a");
    expect(socketUrl("/_gpucp/terminal?token=a", page)).toBe("wss://portal.example/_gpucp/terminal?token=a");
    expect(socketUrl("http://h:8001/t", page)).toBe("ws://h:8001/t");
  });
});

describe("closeText", () => {
  it("says why, per the proxy's close codes, with its reason", () => {
    expect(closeText(1000, "")).toBe("The shell exited.");
    expect(closeText(4410, "The window ended at 12:00.")).toBe("The reservation's window ended. The window ended at 12:00.");
    expect(closeText(4404, "")).toMatch(/^The terminal was refused/);
    expect(closeText(4409, "")).toBe("The container is not ready for a terminal yet.");
    expect(closeText(1011, "docker exec failed")).toBe("The connection to the container failed. docker exec failed");
    expect(closeText(1006, "")).toBe("The connection was lost.");
    expect(closeText(4000, " ")).toBe("The terminal closed (code 4000).");
  });

  it("offers a reconnect except after the window ended", () => {
    expect(canReconnect(1000)).toBe(true);
    expect(canReconnect(1011)).toBe(true);
    expect(canReconnect(4410)).toBe(false);
  });
});
