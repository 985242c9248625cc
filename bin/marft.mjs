#!/usr/bin/env node
// In a checkout (src/ is here) the CLI runs from the TypeScript through tsx, so there is no build step
// to forget; an installed package has no src/ and no tsx, and runs the compiled JavaScript in dist/.
import { existsSync } from "node:fs";

// Node ends with exit code 13 and no word when the awaited command can never finish (nothing left
// that could settle it): a bug, but it must not pass in silence.
process.on("exit", () => {
  if (process.exitCode === 13)
    process.stderr.write(
      "marft: internal error: the command stopped without finishing (an await that never settled)\n",
    );
});

const source = new URL("../src/cli/main.ts", import.meta.url);
let entry = new URL("../dist/cli/main.js", import.meta.url);
if (existsSync(source)) {
  const { register } = await import("tsx/esm/api");
  register();
  entry = source;
}
const { main } = await import(entry.href);
await main(process.argv.slice(2));
