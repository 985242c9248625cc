// The dashboard page as one HTML document: the browser code (src/dashboard/client/, TypeScript,
// bundled with uPlot by esbuild when first needed: no build step to forget) and the styles inline.
// The live server sends it as is; report.html is the same page with the data embedded, so both show
// the same views, and its Content-Security-Policy forbids every request, so it opens offline.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { buildSync } from "esbuild";
import type { StaticData } from "./api.ts";

const CLIENT = join(import.meta.dirname, "client");
const require = createRequire(import.meta.url);

let bundle: { js: string; css: string } | undefined;

/** The page's script and styles (built once per process, about 0.1 s). */
function assets(): { js: string; css: string } {
  if (bundle) return bundle;
  const out = buildSync({
    entryPoints: [join(CLIENT, "main.ts")],
    bundle: true,
    format: "iife",
    target: "es2020",
    minify: true,
    write: false,
    legalComments: "none",
    banner: { js: "/* MARFT dashboard. Includes uPlot 1.6.32, (c) 2025 Leon Sorokin, MIT license. */" },
    logLevel: "silent",
  });
  const js = out.outputFiles[0]!.text;
  // the code goes inside <script>: a "</script" in it would end it early
  if (/<\/script/i.test(js)) throw new Error("dashboard bundle: contains </script, cannot be inlined");
  const css = [
    readFileSync(require.resolve("uplot/dist/uPlot.min.css"), "utf8"),
    readFileSync(join(CLIENT, "style.css"), "utf8"),
  ].join("\n");
  bundle = { js, css };
  return bundle;
}

/** JSON inside <script>: "</script>" and "<!--" must not appear in it. */
function embedJson(value: unknown): string {
  return JSON.stringify(value)
    .replace(/</g, "\\u003c")
    .replace(/\u2028/g, "\\u2028")
    .replace(/\u2029/g, "\\u2029");
}

const escapeHtml = (s: string) =>
  s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]!);

export interface Page {
  html: string;
  /** The Content-Security-Policy the page needs (the live server sends it as a header). */
  csp: string;
}

/**
 * live: the page fetches from the server that sent it and listens to its events.
 * static: everything is in the file (report.html); no request of any kind is allowed.
 */
export function renderPage(
  opts: { mode: "live" } | { mode: "static"; data: StaticData; title: string },
): Page {
  const { js, css } = assets();
  const hash = createHash("sha256").update(js).digest("base64");
  const connect = opts.mode === "live" ? "'self'" : "'none'";
  const csp = `default-src 'none'; script-src 'sha256-${hash}'; style-src 'unsafe-inline'; img-src data:; connect-src ${connect}; base-uri 'none'; form-action 'none'`;
  const title = opts.mode === "static" ? opts.title : "MARFT dashboard";
  const data =
    opts.mode === "static"
      ? `<script type="application/json" id="marft-data">${embedJson(opts.data)}</script>\n`
      : "";
  const html = `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
${opts.mode === "static" ? `<meta http-equiv="Content-Security-Policy" content="${csp}">\n` : ""}<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<style>${css}</style>
</head><body data-mode="${opts.mode}">
<div id="app"><p class="loading">loading…</p></div>
${data}<script>${js}</script>
</body></html>
`;
  return { html, csp };
}
