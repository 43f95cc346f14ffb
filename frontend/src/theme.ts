// The portal's Mantine theme. Mantine's default light scheme draws text below WCAG AA's 4.5:1 in several places
// (dimmed text: grey 6 on white, 3.32:1; white on the primary blue 6, 3.55:1; light-variant badges and buttons,
// e.g. yellow 6 on its own tint, 1.66:1). Here every colour gets shades for text that reach MIN_CONTRAST on
// white, on the page's grey and on the colour's own light tint, and filled surfaces take black or white text,
// whichever reads better.

import { DEFAULT_THEME, createTheme, type CSSVariablesResolver, type MantineColorsTuple } from "@mantine/core";

import { type Rgb, WHITE, darkenUntil, hexToRgb, over, rgbToHex } from "./lib/contrast";

/** A little above AA's 4.5, so rounding in the browser cannot take a colour below it. */
export const MIN_CONTRAST = 4.6;
/** The shade used for filled surfaces (buttons, filled badges) and tints. Mantine's default is 6. */
export const FILLED_SHADE = 8;
/** The tint behind light-variant text: the filled shade at 10% over white, as Mantine mixes it. */
export const LIGHT_ALPHA = 0.1;
/** The same tint when hovered. */
export const LIGHT_HOVER_ALPHA = 0.12;
/** The lightest backgrounds text is drawn on besides white: gray 0 (cards, code) and gray 1 (table stripes). */
const PAGE_GREYS = [DEFAULT_THEME.colors.gray[0], DEFAULT_THEME.colors.gray[1]].map(hexToRgb);

export interface AccessibleColor {
  /** Filled surfaces. */
  filled: string;
  /** The tint behind light-variant text (also NavLink's active background). */
  light: string;
  /** Text and outlines in this colour: on white, page greys and the light tint. */
  text: string;
}

export function accessibleColor(shades: MantineColorsTuple | readonly string[]): AccessibleColor {
  const filled = hexToRgb(shades[FILLED_SHADE]);
  const light = over(filled, LIGHT_ALPHA);
  const text = darkenUntil(filled, textBackgrounds(filled), MIN_CONTRAST);
  return { filled: rgbToHex(filled), light: rgbToHex(light), text: rgbToHex(text) };
}

/**
 * What a colour's text may be drawn on: white and the page greys; its own tint, hovered (12%), over those; and
 * its tint over any other colour's tint (a light button inside a green alert).
 */
export function textBackgrounds(filled: Rgb): Rgb[] {
  const bases = [WHITE, ...PAGE_GREYS];
  const tints = Object.entries(DEFAULT_THEME.colors)
    .filter(([name]) => name !== "dark")
    .map(([, shades]) => over(hexToRgb(shades[FILLED_SHADE]), LIGHT_ALPHA));
  return [...bases, ...[...bases, ...tints].map((base) => over(filled, LIGHT_HOVER_ALPHA, base))];
}

/** Dimmed (secondary) text: Mantine's grey 6, darkened just enough. */
export const DIMMED = rgbToHex(
  darkenUntil(hexToRgb(DEFAULT_THEME.colors.gray[6]), [WHITE, ...PAGE_GREYS, ...lightTints()], MIN_CONTRAST),
);

function lightTints(): Rgb[] {
  return [hexToRgb(accessibleColor(DEFAULT_THEME.colors.blue).light)];
}

export const theme = createTheme({
  primaryColor: "blue",
  primaryShade: { light: FILLED_SHADE, dark: FILLED_SHADE },
  defaultRadius: "md",
  // Black or white text on filled surfaces, whichever contrasts more: at luminance 0.179 both give 4.58:1.
  autoContrast: true,
  luminanceThreshold: 0.179,
  // Plain objects rather than Modal.extend(...): importing the components here would pull Modal, Alert and the
  // rest into the first load, which the sign-in page does not need.
  components: {
    // Every close button is named (an icon alone says nothing to a screen reader); a component may still pass
    // its own label.
    CloseButton: { defaultProps: { "aria-label": "Close" } },
    Modal: { defaultProps: { closeButtonProps: { "aria-label": "Close" } } },
    Drawer: { defaultProps: { closeButtonProps: { "aria-label": "Close" } } },
    Alert: { defaultProps: { closeButtonLabel: "Dismiss" } },
    // A link inside text is told apart by more than colour.
    Anchor: { defaultProps: { underline: "always" } },
  },
});

/** The light scheme's text colours, replacing the shades Mantine picks (see the top of this file). */
export const cssVariablesResolver: CSSVariablesResolver = () => {
  const light: Record<string, string> = {
    "--mantine-color-dimmed": DIMMED,
    "--mantine-color-error": accessibleColor(DEFAULT_THEME.colors.red).text,
    "--mantine-color-anchor": accessibleColor(DEFAULT_THEME.colors.blue).text,
  };
  for (const [name, shades] of Object.entries(DEFAULT_THEME.colors)) {
    if (name === "dark") continue;
    const c = accessibleColor(shades);
    light[`--mantine-color-${name}-text`] = c.text;
    light[`--mantine-color-${name}-light-color`] = c.text;
    light[`--mantine-color-${name}-outline`] = c.text;
  }
  return { variables: {}, light, dark: {} };
};
