// Small DOM helpers, number formats and the colours every view shares.

type Attrs = Record<string, string | number | boolean | undefined | ((e: Event) => void)>;
type Child = Node | string | null | undefined | false;

/** An element with attributes (`on<event>` keys become listeners) and children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Array<Child | Child[]>
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    if (typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = String(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c);
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function svg(
  tag: string,
  attrs: Record<string, string | number> = {},
  ...children: Node[]
): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  el.append(...children);
  return el;
}

/** A number as a person reads it: 3 significant digits, small ones in exponent form. */
export function fmt(x: number | null | undefined, digits = 3): string {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(digits - 1);
  return Number(x.toPrecision(digits)).toString();
}

export const signed = (x: number) => (x > 0 ? "+" : "") + fmt(x);

export function ago(ms: number): string {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} days ago`;
}

/** Series colours: the team first, then agents in profile order (Tableau 10). */
const PALETTE = [
  "#4e79a7",
  "#f28e2b",
  "#59a14f",
  "#e15759",
  "#76b7b2",
  "#edc948",
  "#b07aa1",
  "#ff9da7",
  "#9c755f",
];
export const TEAM_COLOR = "#222222";

export function colorOf(index: number): string {
  return PALETTE[((index % PALETTE.length) + PALETTE.length) % PALETTE.length]!;
}

/**
 * An advantage as a background colour: green for pushed up, red for pushed down, white for zero,
 * full strength at `scale` (the largest |advantage| of the iteration).
 */
export function advantageColor(a: number, scale: number): string {
  const t = Math.min(1, Math.abs(a) / (scale || 1));
  const [r, g, b] = a >= 0 ? [26, 152, 80] : [215, 48, 39];
  const mix = (c: number) => Math.round(255 + (c - 255) * t * 0.85);
  return `rgb(${mix(r)}, ${mix(g)}, ${mix(b)})`;
}

/** Control characters made visible (a random-init model samples them): U+2400 control pictures. */
export function visible(text: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: these are exactly the characters to replace
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, (c) =>
    String.fromCharCode(c === "\u007f" ? 0x2421 : 0x2400 + c.charCodeAt(0)),
  );
}
