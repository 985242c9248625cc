// The JSON Schema of the run config, for editors: schemas/run-config.json. Written by
//   npx tsx src/config/json-schema.ts
// tests/config.test.ts fails when the committed file drifts from the zod schema.
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { RunConfigObject } from "./schema.ts";

export const SCHEMA_FILE = fileURLToPath(new URL("../../schemas/run-config.json", import.meta.url));

export function runConfigJsonSchema(): Record<string, unknown> {
  return z.toJSONSchema(RunConfigObject.describe("MARFT run config"), {
    io: "input",
    unrepresentable: "any",
  }) as Record<string, unknown>;
}

export function schemaText(): string {
  return `${JSON.stringify(runConfigJsonSchema(), null, 2)}\n`;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(SCHEMA_FILE, schemaText());
  process.stdout.write(`wrote ${SCHEMA_FILE}\n`);
}
