#!/usr/bin/env node
// Runs the TypeScript CLI directly through tsx, so there is no build step to forget.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../src/cli/main.ts");
await main(process.argv.slice(2));
