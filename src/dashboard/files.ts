// The files of a run directory and of `marft compare` as the dashboard reads them: each parsed with
// zod, each error naming its file (and line). The schemas ask only for what the views use and let
// other keys through, so runs written by older or newer versions still show.
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { DataError } from "../errors.ts";
import { errorMap, issueLines } from "../fields.ts";
import { edgesOf } from "../flexmg/graph.ts";
import type { GraphSpec } from "../flexmg/types.ts";
import { TranscriptRecordSchema } from "../train/transcripts.ts";
import type { AgentView, CompareData, EvalView, GraphView, MetricsRow, TranscriptRecord } from "./api.ts";

/** Validate `value`; a DataError lists every problem as `<where>: <path>: <what>`. */
export function parseAs<S extends z.ZodType>(schema: S, value: unknown, where: string): z.output<S> {
  const r = schema.safeParse(value, { reportInput: true, error: errorMap });
  if (r.success) return r.data;
  throw new DataError(
    r.error.issues
      .flatMap((i) => issueLines(i))
      .map((l) => `${where}: ${l}`)
      .join("\n"),
  );
}

function parseJson(text: string, where: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new DataError(`${where}: not JSON (${(e as Error).message})`);
  }
}

const ConfigSchema = z.object({
  agents: z
    .array(z.object({ id: z.string(), role: z.string(), trainable: z.boolean().default(true) }))
    .min(1),
  graph: z
    .object({ kind: z.string(), edges: z.array(z.tuple([z.string(), z.string()])).optional() })
    .prefault({
      kind: "sequential",
    }),
  algo: z.object({ estimator: z.string().default("marft-a") }).prefault({}),
  ppo: z.object({ klCoef: z.number().default(0) }).prefault({}),
  train: z.object({ iterations: z.number().int().optional() }).prefault({}),
});

export interface ConfigView {
  agents: AgentView[];
  graph: GraphView;
  estimator: string;
  klCoef: number;
  totalIterations: number | null;
}

/** config.yaml: the team, its dependency graph (static edges as the trainer derives them), the algorithm. */
export function readConfig(path: string): ConfigView {
  let raw: unknown;
  try {
    raw = parseYaml(readFileSync(path, "utf8"));
  } catch (e) {
    throw new DataError(`${path}: ${(e as Error).message.split("\n")[0]}`);
  }
  const c = parseAs(ConfigSchema, raw, path);
  const ids = c.agents.map((a) => a.id);
  const known = ["sequential", "parallel", "dynamic", "edges"];
  const spec = (known.includes(c.graph.kind) ? c.graph : { kind: "dynamic" }) as GraphSpec;
  return {
    agents: c.agents,
    graph: { kind: c.graph.kind, edges: edgesOf(ids, spec) },
    estimator: c.algo.estimator,
    klCoef: c.ppo.klCoef,
    totalIterations: c.train.iterations ?? null,
  };
}

const MetricsRowSchema = z.record(z.string(), z.number().nullable());

/**
 * The complete lines of a JSONL text (a line still being appended, without its newline, waits for
 * the next read), each as `[line number, text]`.
 */
export function completeLines(text: string): Array<[number, string]> {
  const lines = text.split("\n");
  lines.pop();
  return lines.flatMap((l, i): Array<[number, string]> => (l.trim() === "" ? [] : [[i + 1, l]]));
}

/** metrics.jsonl, one row per iteration (NaN was written as null). */
export function parseMetrics(text: string, path: string): MetricsRow[] {
  return completeLines(text).map(([n, l]) =>
    parseAs(MetricsRowSchema, parseJson(l, `${path}:${n}`), `${path}:${n}`),
  );
}

/** One transcripts.jsonl line. */
export function parseTranscript(line: string, where: string): TranscriptRecord {
  return parseAs(TranscriptRecordSchema, parseJson(line, where), where);
}

const EvalSchema = z.object({
  iteration: z.number(),
  accuracy: z.number(),
  ci95: z.tuple([z.number(), z.number()]),
  n: z.number(),
});

const SummarySchema = z.object({
  iterations: z.number(),
  stoppedEarly: z.boolean(),
  eval: z.object({ before: EvalSchema.optional(), after: EvalSchema.optional() }).prefault({}),
});

export interface SummaryView {
  iterations: number;
  stoppedEarly: boolean;
  eval: { before?: EvalView; after?: EvalView };
}

/** summary.json, written when a run ends (also when it stops early or fails). */
export function readSummary(path: string): SummaryView {
  return parseAs(SummarySchema, parseJson(readFileSync(path, "utf8"), path), path);
}

const ci = z.tuple([z.number(), z.number()]);

/** compare.json of `marft compare`: per variant, per-seed accuracies and the mean with its interval. */
const CompareSchema = z.object({
  variants: z
    .array(
      z.object({
        name: z.string(),
        seeds: z.array(
          z.object({
            seed: z.number(),
            accuracy: z.number(),
            ci95: ci,
            sampled_tokens: z.number(),
            wall_s: z.number(),
          }),
        ),
        mean: z.number().nullable(),
        ci95: ci.nullable(),
        vs_first: z.object({ diff: z.number(), ci95: ci, paired_p: z.number() }).nullable().optional(),
      }),
    )
    .min(1),
});

export function readCompare(path: string, name: string): CompareData {
  return { name, ...parseAs(CompareSchema, parseJson(readFileSync(path, "utf8"), path), path) };
}
