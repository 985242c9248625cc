// The build's second step: what tsc does not emit goes from src/ to the same place under dist/:
// declaration files (openapi.d.ts, generated) and the files loaded at run time from beside the
// modules that use them (the sandbox's Python wrapper, the math judge's worker, and the dashboard's
// browser code, which esbuild bundles from its TypeScript when a page is first served).
import { copyFileSync, mkdirSync, readdirSync, statSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const ASSET = /(\.py|\.mjs|\.d\.ts)$/;

function walk(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p);
    else if (ASSET.test(name) || p.includes(join("src", "dashboard", "client"))) {
      const to = join(root, "dist", relative(join(root, "src"), p));
      mkdirSync(dirname(to), { recursive: true });
      copyFileSync(p, to);
    }
  }
}
walk(join(root, "src"));
