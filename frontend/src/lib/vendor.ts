import type { GpuVendor, ServerGpu } from "../api/types";

const VENDOR_NAMES: Record<GpuVendor, string> = { nvidia: "NVIDIA", amd: "AMD" };

/** "NVIDIA", "AMD", or both joined when a server mixes them (it should not, but the page must not lie). */
export function vendorLabel(gpus: Pick<ServerGpu, "vendor">[]): string {
  const vendors = [...new Set(gpus.map((g) => g.vendor ?? "nvidia"))];
  return vendors.map((v) => VENDOR_NAMES[v] ?? v).join(" + ");
}

/** A GPU's MIG state in a few words: null when it cannot do MIG; "MIG off", "MIG: 3g.40gb + 2g.20gb", and
 * the pending mode while a reset is due. */
export function migSummary(gpu: Pick<ServerGpu, "mig_mode" | "mig_devices">): string | null {
  const mode = gpu.mig_mode;
  if (!mode) return null;
  const pending = mode.pending !== mode.current ? ` (${mode.pending ? "on" : "off"} after reset)` : "";
  if (!mode.current) return `MIG off${pending}`;
  const profiles = gpu.mig_devices.map((d) => d.profile || "?").sort();
  return `MIG: ${profiles.length ? profiles.join(" + ") : "no instances"}${pending}`;
}

/** "3g.40gb+2x1g.10gb" -> ["3g.40gb", "1g.10gb", "1g.10gb"], as the agent's spec reads it; "+me" stays with its
 * profile ("1g.10gb+me"). Empty text is MIG on with no instances. */
export function parseMigLayout(text: string): string[] {
  const parts: string[] = [];
  for (const raw of text.split("+")) {
    const piece = raw.trim();
    if (parts.length && piece && !/^\d/.test(piece)) parts[parts.length - 1] += `+${piece}`;
    else if (piece) parts.push(piece);
  }
  return parts.flatMap((part) => {
    const m = /^(\d+)x(.+)$/.exec(part);
    return m ? Array<string>(Number(m[1])).fill(m[2]) : [part];
  });
}
