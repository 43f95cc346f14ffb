// WCAG 2 contrast, for choosing the theme's colours: text must reach 4.5:1 against what it is drawn on.

export type Rgb = [number, number, number];

export const WHITE: Rgb = [255, 255, 255];
export const BLACK: Rgb = [0, 0, 0];

export function hexToRgb(hex: string): Rgb {
  const h = hex.replace("#", "");
  const full = h.length === 3 ? [...h].map((c) => c + c).join("") : h;
  return [0, 2, 4].map((i) => parseInt(full.slice(i, i + 2), 16)) as Rgb;
}

export function rgbToHex([r, g, b]: Rgb): string {
  return `#${[r, g, b].map((v) => Math.round(v).toString(16).padStart(2, "0")).join("")}`;
}

/** WCAG relative luminance. */
export function luminance([r, g, b]: Rgb): number {
  const lin = (c: number) => {
    const s = c / 255;
    return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
  };
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}

export function contrast(a: Rgb, b: Rgb): number {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
}

/** `color` at opacity `alpha` over `base`, as the browser composites it. */
export function over(color: Rgb, alpha: number, base: Rgb = WHITE): Rgb {
  return color.map((c, i) => Math.round(c * alpha + base[i] * (1 - alpha))) as Rgb;
}

/** `color` darkened in small steps (towards black, keeping its hue) until it reaches `min` against every background. */
export function darkenUntil(color: Rgb, backgrounds: Rgb[], min: number): Rgb {
  for (let k = 0; k <= 1.0001; k += 0.02) {
    const c = color.map((v) => Math.round(v * (1 - k))) as Rgb;
    if (backgrounds.every((bg) => contrast(c, bg) >= min)) return c;
  }
  return BLACK;
}
