// Shared dataset readers: JSON arrays and JSONL files, with errors that name the file and the line.
// A record's line is where it starts in the file (1-based), so a person can jump to it.
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { dirname, isAbsolute, join, resolve } from "node:path";
import type { z } from "zod";
import { DataError } from "../errors.ts";
import { name, nonNegInt, posInt } from "../fields.ts";

const REPO = resolve(import.meta.dirname, "../..");
let datasets: string | undefined;

/**
 * The project's shared datasets folder (MATH, GSM8K, MBPP; never copied into the repository):
 * $MARFT_DATASETS if set, else `../shared/datasets` beside this repository, else beside the
 * repository this checkout was cloned from when that is a local folder (a scratch `git clone` of a
 * checkout finds the same data). The error names every place it looked.
 */
export function datasetsDir(): string {
  datasets ??= findDatasetsDir();
  return datasets;
}

export function findDatasetsDir(): string {
  const env = process.env["MARFT_DATASETS"];
  if (env) {
    if (!existsSync(env)) throw new Error(`MARFT_DATASETS: ${env} does not exist`);
    return resolve(env);
  }
  const tried = [resolve(REPO, "../shared/datasets")];
  try {
    const origin = execFileSync("git", ["-C", REPO, "remote", "get-url", "origin"], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "ignore"],
    }).trim();
    if (isAbsolute(origin)) tried.push(join(dirname(resolve(origin)), "shared/datasets"));
  } catch {
    // not a git checkout, or no origin: only the folder beside the repository counts
  }
  const found = tried.find((d) => existsSync(d));
  if (found === undefined) {
    throw new Error(`shared datasets not found: set MARFT_DATASETS, or place them at ${tried.join(" or ")}`);
  }
  return found;
}

export interface JsonRecord {
  /** 1-based line where the record starts. */
  line: number;
  value: unknown;
}

/** An error about one record of a data file; the message reads `<file>:<line>: <what is wrong>`. */
export class DatasetError extends DataError {
  override name = "DatasetError";
  constructor(
    readonly file: string,
    readonly line: number,
    readonly detail: string,
  ) {
    super(`${file}:${line}: ${detail}`);
  }
}

/**
 * Reads every record of a JSON or JSONL file. A file whose first non-blank character is `[` is a JSON
 * array (the MARFT reference's and MBPP's format); anything else is JSONL (one object per line, blank
 * lines skipped), whatever the extension says.
 */
export function readJsonRecords(file: string): JsonRecord[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new DataError(`${file}: cannot read: ${(e as Error).message}`);
  }
  return parseJsonRecords(text, file);
}

/** `readJsonRecords` on text already in memory; `file` only names the source in errors. */
export function parseJsonRecords(text: string, file: string): JsonRecord[] {
  const start = text.search(/\S/);
  if (start >= 0 && text[start] === "[") return parseJsonArray(text, file);
  return parseJsonLines(text, file);
}

function parseJsonLines(text: string, file: string): JsonRecord[] {
  const out: JsonRecord[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!.trim();
    if (raw === "") continue;
    try {
      out.push({ line: i + 1, value: JSON.parse(raw) });
    } catch (e) {
      throw new DatasetError(file, i + 1, `invalid JSON: ${(e as Error).message}`);
    }
  }
  return out;
}

function parseJsonArray(text: string, file: string): JsonRecord[] {
  let values: unknown;
  try {
    values = JSON.parse(text);
  } catch (e) {
    const msg = (e as Error).message;
    // V8 reports "at position N" for some errors only; otherwise find the first element that fails alone.
    const pos = /position (\d+)/.exec(msg);
    const line = lineOf(text, pos ? Number(pos[1]) : firstBadElementOffset(text));
    throw new DatasetError(file, line, `invalid JSON: ${msg}`);
  }
  if (!Array.isArray(values)) throw new DatasetError(file, 1, "expected a JSON array of records");
  const lines = linesOf(text, topLevelElementOffsets(text));
  return values.map((value, i) => ({ line: lines[i] ?? 1, value }));
}

/** Offsets where each element of the top-level array starts (the text is known to be valid JSON). */
function topLevelElementOffsets(text: string): number[] {
  const out: number[] = [];
  let depth = 0;
  let inString = false;
  let expectValue = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (inString) {
      if (c === "\\") i++;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === " " || c === "\n" || c === "\r" || c === "\t") continue;
    if (depth === 1 && expectValue && c !== "]") {
      out.push(i);
      expectValue = false;
    }
    if (c === '"') inString = true;
    else if (c === "[" || c === "{") {
      depth++;
      if (depth === 1) expectValue = true;
    } else if (c === "]" || c === "}") depth--;
    else if (c === "," && depth === 1) expectValue = true;
  }
  return out;
}

function firstBadElementOffset(text: string): number {
  const starts = topLevelElementOffsets(text);
  for (let i = 0; i < starts.length; i++) {
    const last = i + 1 === starts.length;
    let chunk = text.slice(starts[i], starts[i + 1] ?? text.length).trimEnd();
    if (last && chunk.endsWith("]")) chunk = chunk.slice(0, -1); // the array's own closing bracket
    chunk = chunk.trimEnd().replace(/,$/, "");
    try {
      JSON.parse(chunk);
    } catch {
      return starts[i]!;
    }
  }
  return 0;
}

/** Line numbers of ascending offsets, in one pass over the text. */
function linesOf(text: string, offsets: number[]): number[] {
  const out: number[] = [];
  let line = 1;
  let pos = 0;
  for (const off of offsets) {
    for (; pos < off && pos < text.length; pos++) if (text.charCodeAt(pos) === 10) line++;
    out.push(line);
  }
  return out;
}

function lineOf(text: string, offset: number): number {
  let line = 1;
  const end = Math.min(offset, text.length);
  for (let i = 0; i < end; i++) if (text.charCodeAt(i) === 10) line++;
  return line;
}

/**
 * Validates one record against a zod object schema, or throws a DatasetError such as
 * `data.jsonl:12: missing field "answer"` or `data.jsonl:12: field "answer": expected string, got number`.
 */
export function parseRecord<S extends z.ZodType>(file: string, record: JsonRecord, schema: S): z.output<S> {
  const { value, line } = record;
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new DatasetError(file, line, `expected a JSON object, got ${describe(value)}`);
  }
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const issue = result.error.issues[0]!;
  const path = issue.path.map(String).join(".");
  const top = issue.path[0];
  if (
    issue.code === "invalid_type" &&
    typeof top === "string" &&
    issue.path.length === 1 &&
    !(top in value)
  ) {
    throw new DatasetError(file, line, `missing field "${path}"`);
  }
  const got = describe(getPath(value, issue.path));
  const expected = issue.code === "invalid_type" ? `expected ${issue.expected}, got ${got}` : issue.message;
  throw new DatasetError(file, line, path ? `field "${path}": ${expected}` : expected);
}

/** Reads a JSON/JSONL file and validates every record: the one call most loaders need. */
export function loadRecords<S extends z.ZodType>(
  file: string,
  schema: S,
): Array<{ line: number; record: z.output<S> }> {
  return readJsonRecords(file).map((r) => ({ line: r.line, record: parseRecord(file, r, schema) }));
}

function getPath(value: unknown, path: readonly PropertyKey[]): unknown {
  let v = value;
  for (const k of path) {
    if (typeof v !== "object" || v === null) return undefined;
    v = (v as Record<PropertyKey, unknown>)[k];
  }
  return v;
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  return typeof v;
}

/**
 * A development split: the last `devSize` rows are held out (deterministic, independent of any seed),
 * the rest is for training. Items keep their ids, so a row is the same problem in every run.
 */
export function holdOutLast<T>(items: readonly T[], devSize: number): { train: T[]; dev: T[] } {
  if (!Number.isInteger(devSize) || devSize < 0)
    throw new Error(`devSize must be a non-negative integer, got ${devSize}`);
  const cut = Math.max(0, items.length - devSize);
  return { train: items.slice(0, cut), dev: items.slice(cut) };
}

/** The fields of a run config's task entry for tasks whose problems come from files (math, code). */
export const fileTaskFields = {
  trainFile: name().describe(
    "training problems (JSON / JSONL), relative to the config file's directory or absolute",
  ),
  evalFile: name()
    .optional()
    .describe("held-out problems; omitted: the last `evalSplit` training rows are held out"),
  evalSplit: nonNegInt().default(100).describe("rows held out of trainFile when there is no evalFile"),
  limit: posInt().optional().describe("use at most this many training problems"),
  evalLimit: posInt().optional().describe("evaluate on at most this many held-out problems"),
};

/** Paths in a config are relative to the config file's directory. */
export function resolveFrom(baseDir: string, p: string): string {
  return isAbsolute(p) ? p : resolve(baseDir, p);
}
