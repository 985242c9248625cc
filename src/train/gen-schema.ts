// Writes schemas/run-config.json (the run config's JSON Schema, for editors) from the zod schema:
//   npx tsx src/train/gen-schema.ts
// tests/config.test.ts fails when the committed file drifts from the schema.
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { runConfigJsonSchema } from "./config.ts";

export const SCHEMA_FILE = fileURLToPath(new URL("../../schemas/run-config.json", import.meta.url));

export function schemaText(): string {
  return `${JSON.stringify(runConfigJsonSchema(), null, 2)}\n`;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(SCHEMA_FILE, schemaText());
  process.stdout.write(`wrote ${SCHEMA_FILE}\n`);
}
