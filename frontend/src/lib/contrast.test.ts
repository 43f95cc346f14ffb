import { DEFAULT_THEME } from "@mantine/core";
import { describe, expect, it } from "vitest";

import { DIMMED, MIN_CONTRAST, accessibleColor, cssVariablesResolver, theme } from "../theme";
import { BLACK, WHITE, contrast, darkenUntil, hexToRgb, luminance, over } from "./contrast";

describe("contrast", () => {
  it("matches WCAG's figures", () => {
    expect(contrast(WHITE, BLACK)).toBeCloseTo(21, 5);
    expect(contrast(hexToRgb("#868e96"), WHITE)).toBeCloseTo(3.32, 2); // Mantine's dimmed grey
    expect(contrast(hexToRgb("#228be6"), WHITE)).toBeCloseTo(3.55, 1); // Mantine's blue 6
  });

  it("darkens until every background is reached, or gives black", () => {
    const c = darkenUntil(hexToRgb("#fab005"), [WHITE], 4.5);
    expect(contrast(c, WHITE)).toBeGreaterThanOrEqual(4.5);
    expect(darkenUntil(WHITE, [BLACK, WHITE], 5)).toEqual(BLACK); // nothing reads on both
  });
});

describe("the theme's colours", () => {
  const names = Object.keys(DEFAULT_THEME.colors).filter((n) => n !== "dark");

  it.each(names)("%s: text reaches 4.5:1 on white, the page greys, its own tint (hovered too) and its tint over others'", (name) => {
    const c = accessibleColor(DEFAULT_THEME.colors[name]);
    const filled = hexToRgb(c.filled);
    const backgrounds = [WHITE, hexToRgb(DEFAULT_THEME.colors.gray[0]), hexToRgb(DEFAULT_THEME.colors.gray[1]), hexToRgb(c.light), over(filled, 0.12)];
    for (const other of names) backgrounds.push(over(filled, 0.12, hexToRgb(accessibleColor(DEFAULT_THEME.colors[other]).light)));
    for (const bg of backgrounds) expect(contrast(hexToRgb(c.text), bg)).toBeGreaterThanOrEqual(MIN_CONTRAST);
  });

  it("a blue light button inside a green alert (found by axe at 4.24:1) now reads", () => {
    const blue = accessibleColor(DEFAULT_THEME.colors.blue);
    const inAlert = over(hexToRgb(blue.filled), 0.1, hexToRgb(accessibleColor(DEFAULT_THEME.colors.green).light));
    expect(contrast(hexToRgb(blue.text), inAlert)).toBeGreaterThanOrEqual(4.5);
  });

  it.each(names)("%s: a filled surface gets black or white text at 4.5:1 or more", (name) => {
    const filled = hexToRgb(accessibleColor(DEFAULT_THEME.colors[name]).filled);
    const text = luminance(filled) > theme.luminanceThreshold! ? BLACK : WHITE;
    expect(contrast(text, filled)).toBeGreaterThanOrEqual(4.5);
  });

  it("dimmed text reaches 4.5:1 on white, grey and the primary tint", () => {
    const tint = hexToRgb(accessibleColor(DEFAULT_THEME.colors.blue).light);
    for (const bg of [WHITE, hexToRgb(DEFAULT_THEME.colors.gray[1]), tint]) {
      expect(contrast(hexToRgb(DIMMED), bg)).toBeGreaterThanOrEqual(MIN_CONTRAST);
    }
  });

  it("the light scheme's variables carry those colours", () => {
    const vars = cssVariablesResolver(DEFAULT_THEME).light as Record<string, string>;
    expect(vars["--mantine-color-dimmed"]).toBe(DIMMED);
    expect(vars["--mantine-color-yellow-light-color"]).toBe(accessibleColor(DEFAULT_THEME.colors.yellow).text);
    expect(contrast(hexToRgb(vars["--mantine-color-error"]), WHITE)).toBeGreaterThanOrEqual(MIN_CONTRAST);
  });

  it("names every close button: modals', alerts' and any other", () => {
    expect(theme.components?.Modal?.defaultProps).toMatchObject({ closeButtonProps: { "aria-label": "Close" } });
    expect(theme.components?.CloseButton?.defaultProps).toMatchObject({ "aria-label": "Close" });
    expect(theme.components?.Alert?.defaultProps).toMatchObject({ closeButtonLabel: "Dismiss" });
  });
});

it("composites a tint over white", () => {
  expect(over([0, 0, 0], 0.5)).toEqual([128, 128, 128]);
});
