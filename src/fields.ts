// Validation at the edges with zod, one way for the whole framework: field helpers with human error
// messages, and the formatting of zod's issues into lines that name the exact path and what was
// expected (`agents[1].adapter.r: expected a positive integer, got "eight"`). Used by the run config
// (src/config) and by the task families' option schemas (src/envs/*).
import { z } from "zod";
import { ConfigError } from "./errors.ts";

export const posInt = (what = "a positive integer") =>
  z
    .number({ error: `expected ${what}` })
    .int({ error: `expected ${what}` })
    .positive({ error: `expected ${what}` });
export const nonNegInt = () =>
  z
    .number({ error: "expected a non-negative integer" })
    .int({ error: "expected a non-negative integer" })
    .min(0, { error: "expected a non-negative integer" });
export const posNum = () =>
  z.number({ error: "expected a positive number" }).positive({ error: "expected a positive number" });
export const nonNegNum = () =>
  z.number({ error: "expected a non-negative number" }).min(0, { error: "expected a non-negative number" });
export const unit = () =>
  z
    .number({ error: "expected a number in [0, 1]" })
    .min(0, { error: "expected a number in [0, 1]" })
    .max(1, { error: "expected a number in [0, 1]" });
export const name = () =>
  z.string({ error: "expected a non-empty string" }).min(1, { error: "expected a non-empty string" });

/** A value as an error message shows it: `"eight"`, `1.5`, `a list`. */
export function show(v: unknown): string {
  if (v === undefined) return "nothing";
  if (v === null) return "null";
  if (Array.isArray(v)) return "a list";
  if (typeof v === "object") return "an object";
  const s = JSON.stringify(v);
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

/** `agents[1].adapter.r` from ["agents", 1, "adapter", "r"]. */
export function formatPath(path: ReadonlyArray<PropertyKey>): string {
  let out = "";
  for (const p of path) {
    if (typeof p === "number") out += `[${p}]`;
    else if (typeof p === "string" && /^[A-Za-z_$][\w$-]*$/.test(p)) out += out ? `.${p}` : p;
    else out += `[${JSON.stringify(String(p))}]`;
  }
  return out || "(root)";
}

type Issue = z.core.$ZodIssue;

/** One readable line per issue; for unions, the branch that came closest explains the error. */
export function issueLines(issue: Issue, prefix: ReadonlyArray<PropertyKey> = []): string[] {
  const path = [...prefix, ...issue.path];
  const input = (issue as { input?: unknown }).input;
  switch (issue.code) {
    case "unrecognized_keys":
      return issue.keys.map((k) => `${formatPath([...path, k])}: unknown key`);
    case "invalid_union": {
      if ("discriminator" in issue && issue.discriminator !== undefined) {
        const opts = (issue as { options?: unknown[] }).options ?? [];
        const got =
          input && typeof input === "object"
            ? (input as Record<string, unknown>)[issue.discriminator]
            : input;
        return [
          `${formatPath(path)}: expected one of ${opts.map((o) => JSON.stringify(o)).join(" | ")}, got ${show(got)}`,
        ];
      }
      const branches = issue.errors.filter((b) => b.length > 0);
      if (branches.length === 0) return [`${formatPath(path)}: ${issue.message}`];
      const best = branches.reduce((a, b) => (b.length < a.length ? b : a));
      return best.flatMap((i) => issueLines(i, path));
    }
    case "invalid_type":
      if (input === undefined)
        return [
          `${formatPath(path)}: required (${issue.message.startsWith("expected") ? issue.message : `expected ${issue.expected}`})`,
        ];
      return [`${formatPath(path)}: ${issue.message}, got ${show(input)}`];
    case "custom":
      return [`${formatPath(path)}: ${issue.message}`];
    default:
      return [`${formatPath(path)}: ${issue.message}${input !== undefined ? `, got ${show(input)}` : ""}`];
  }
}

/** zod's generic messages, rephrased for the ones our schema does not customise. */
export const errorMap: z.core.$ZodErrorMap = (iss) => {
  switch (iss.code) {
    case "invalid_type":
      return `expected ${iss.expected === "object" ? "a mapping" : iss.expected === "array" ? "a list" : `a ${iss.expected}`}`;
    case "invalid_value":
      return `expected ${iss.values.map((v) => JSON.stringify(v)).join(" | ")}`;
    case "too_small":
      return iss.origin === "array"
        ? `expected at least ${iss.minimum} item(s)`
        : `expected ${iss.inclusive ? ">=" : ">"} ${iss.minimum}`;
    case "too_big":
      return iss.origin === "array"
        ? `expected at most ${iss.maximum} item(s)`
        : `expected ${iss.inclusive ? "<=" : "<"} ${iss.maximum}`;
    case "invalid_format":
      return `expected a ${iss.format}`;
    default:
      return undefined;
  }
};

/**
 * Validate a task family's options given in code (a suite or env built directly, not from a run
 * config, which validates the same schema at load time); the first problem becomes an error like
 * `secret.speakerChars: expected a positive integer, got 0`.
 */
export function parseOptions<S extends z.ZodType>(schema: S, value: unknown, where: string): z.output<S> {
  const r = schema.safeParse(value ?? {}, { reportInput: true, error: errorMap });
  if (r.success) return r.data;
  const prefix = where.split(".");
  const lines = r.error.issues.flatMap((i) =>
    i.code === "unrecognized_keys" && i.path.length === 0
      ? [`${where}: unknown option ${i.keys.map((k) => JSON.stringify(k)).join(", ")}`]
      : issueLines(i, prefix),
  );
  throw new ConfigError(where, lines, null);
}
