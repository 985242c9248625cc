#!/usr/bin/env node
// Runs the TypeScript CLI directly through tsx, so there is no build step to forget.
import { register } from "tsx/esm/api";

// Node ends with exit code 13 and no word when the awaited command can never finish (nothing left
// that could settle it): a bug, but it must not pass in silence.
process.on("exit", () => {
  if (process.exitCode === 13)
    process.stderr.write(
      "marft: internal error: the command stopped without finishing (an await that never settled)\n",
    );
});

register();
const { main } = await import("../src/cli/main.ts");
await main(process.argv.slice(2));
