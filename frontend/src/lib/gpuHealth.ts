// What the fleet page says about a GPU's health: each reason in plain words, and heatmap colours whose text is
// readable on them.

import { contrast } from "./contrast";

/** XIDs an operator meets most, in one line each (NVIDIA's XID catalogue has the rest). */
export const XID_TEXT: Record<number, string> = {
  13: "graphics engine exception (usually the application's fault)",
  31: "GPU memory page fault (usually the application's fault)",
  43: "GPU stopped processing (usually the application's fault)",
  45: "preemptive cleanup after an earlier error",
  48: "double-bit ECC error: uncorrectable memory error; drain and reset the GPU",
  61: "internal micro-controller breakpoint/warning",
  62: "internal micro-controller halt",
  63: "ECC page retirement or row remapping recorded; a reset applies it",
  64: "ECC page retirement or row remapping failed; the GPU needs service",
  68: "video processor exception (usually the application's fault)",
  69: "graphics engine class error",
  74: "NVLink error: a link between GPUs failed",
  79: "GPU has fallen off the bus: it stopped answering the host; reseat or power-cycle it",
  92: "high single-bit ECC error rate",
  94: "contained ECC error: one application was affected, a reset clears it",
  95: "uncontained ECC error: every application on the GPU was affected; reset the GPU",
  109: "context switch timeout (usually the application's fault)",
  119: "GSP firmware did not respond in time",
  120: "GSP firmware error",
};

export interface HealthLine {
  reason: string;
  text: string;
}

/** One reason (as the API gives them: "xid:79", "temperature", "ecc_dbe", ...) in plain words. */
export function explainReason(reason: string, temperatureC?: number | null, limitC?: number | null): string {
  const xid = /^xid[: ](\d+)$/.exec(reason.trim());
  if (xid) {
    const n = Number(xid[1]);
    return `XID ${n}: ${XID_TEXT[n] ?? "a driver-reported fault; see NVIDIA's XID catalogue"}`;
  }
  switch (reason) {
    case "temperature": {
      const now = temperatureC == null ? "no reading now" : `${Math.round(temperatureC)} °C now`;
      const limit = limitC == null ? "the fleet's limit" : `the limit of ${limitC} °C`;
      return `temperature: ${now}, over ${limit}; clears by itself when it cools down`;
    }
    case "missing":
      return "missing: the agent no longer reports this GPU";
    case "ecc_dbe":
      return "double-bit ECC error: the uncorrectable error counter rose";
    case "retired_pages_pending":
      return "retired memory pages pending: a GPU reset applies them";
    case "row_remap_failure":
      return "row remapping failed: the GPU's memory needs service";
    default:
      return reason;
  }
}

/** The reasons of a GPU (the API's list, or anything older) as strings. */
export function reasonList(reasons: unknown): string[] {
  if (!reasons) return [];
  if (Array.isArray(reasons)) {
    return reasons.map((r) =>
      typeof r === "string" ? r : r && typeof r === "object" && "message" in r ? String((r as { message: unknown }).message) : JSON.stringify(r),
    );
  }
  return [typeof reasons === "string" ? reasons : JSON.stringify(reasons)];
}

// --- colours ------------------------------------------------------------------------------------------------

function hslToRgb(h: number, s: number, l: number): [number, number, number] {
  const a = s * Math.min(l, 1 - l);
  const f = (n: number) => {
    const k = (n + h / 30) % 12;
    return l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1));
  };
  return [f(0), f(8), f(4)].map((v) => Math.round(v * 255)) as [number, number, number];
}

const DARK_TEXT: [number, number, number] = [26, 27, 30];
const LIGHT_TEXT: [number, number, number] = [255, 255, 255];

export interface CellColors {
  background: string;
  color: string;
  rgb: [number, number, number];
  text: [number, number, number];
}

/**
 * A heatmap cell's colours for a 0..max value: utilization from pale grey-blue (idle) to deep blue (busy),
 * temperature from pale blue (cool) to deep red (hot). The text is whichever of near-black and white reads
 * better on the background, so it always passes 4.5:1. Idle is never green: an idle GPU is not "good".
 */
export function heatCell(value: number | null | undefined, max: number, scale: "util" | "temp"): CellColors {
  const text = (rgb: [number, number, number]) =>
    contrast(rgb, DARK_TEXT) >= contrast(rgb, LIGHT_TEXT) ? DARK_TEXT : LIGHT_TEXT;
  if (value === null || value === undefined || !Number.isFinite(value)) {
    const rgb: [number, number, number] = [222, 226, 230];
    return { background: `rgb(${rgb.join(" ")})`, color: `rgb(${text(rgb).join(" ")})`, rgb, text: text(rgb) };
  }
  const f = Math.min(1, Math.max(0, value / max));
  const [h, s] = scale === "util" ? [215, 0.15 + 0.6 * f] : [210 - 210 * f, 0.75];
  let l = scale === "util" ? 0.92 - 0.6 * f : 0.9 - 0.55 * f;
  let rgb = hslToRgb(h, s, l);
  // Mid tones read poorly with either text colour: darken them until white text passes 4.5:1.
  while (contrast(rgb, text(rgb)) < 4.5 && l > 0.05) {
    l -= 0.02;
    rgb = hslToRgb(h, s, l);
  }
  const fg = text(rgb);
  return { background: `rgb(${rgb.join(" ")})`, color: `rgb(${fg.join(" ")})`, rgb, text: fg };
}
