// `marft demo --resume`: what an earlier demo in the same directory finished and can be kept. A job
// (one seed's team or single agent) is kept when its training finished under the same config, and
// its evaluations too when they were written (demo-evals.json, beside the job's summary.json);
// anything else is trained or evaluated again. Several seeds take hours on a CPU, and one Ctrl-C or
// crash should not cost the seeds already done.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { configToYaml } from "../config/load.ts";
import type { RunConfig } from "../config/schema.ts";
import type { EvalResult, VoteResult } from "../train/evaluate.ts";
import { RunDir, type TrainerState, writeFileAtomic } from "../train/rundir.ts";

const ci95 = z.tuple([z.number(), z.number()]);
const EvalFile = z.object({
  accuracy: z.number(),
  ci95,
  n: z.number(),
  meanScore: z.number(),
  passAtK: z.number().optional(),
  k: z.number().optional(),
  perTask: z.record(z.string(), z.object({ accuracy: z.number(), ci95, n: z.number() })).optional(),
  problems: z.array(
    z.object({
      taskId: z.string(),
      correct: z.boolean(),
      score: z.number(),
      samplesCorrect: z.number().optional(),
      transcript: z.array(z.object({ role: z.string(), content: z.string() })),
      info: z.record(z.string(), z.unknown()),
    }),
  ),
  tokensSampled: z.number(),
  seconds: z.number(),
});
const VoteFile = z.object({
  accuracy: z.number(),
  ci95,
  n: z.number(),
  k: z.number(),
  correct: z.array(z.boolean()),
  tokensSampled: z.number(),
  seconds: z.number(),
});
const JobEvalsFile = z.object({
  before: EvalFile.optional(),
  after: EvalFile,
  vote: VoteFile.optional(),
});
const SummaryFile = z.object({ iterations: z.number(), tokensSampled: z.number(), wallSeconds: z.number() });

/** A job's evaluations: the team's before and after, the single agent's after and its vote. */
export interface JobEvals {
  before?: EvalResult;
  after: EvalResult;
  vote?: VoteResult;
}

export const evalsPath = (runDir: string) => join(runDir, "demo-evals.json");

export function writeJobEvals(runDir: string, evals: JobEvals): void {
  writeFileAtomic(evalsPath(runDir), `${JSON.stringify(evals)}\n`);
}

/** The job's evaluations, or undefined when none were written; a file that is not one names itself. */
export function readJobEvals(runDir: string): JobEvals | undefined {
  const path = evalsPath(runDir);
  if (!existsSync(path)) return undefined;
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new Error(`${path}: not JSON (${(e as Error).message}); delete it to evaluate the job again`);
  }
  const r = JobEvalsFile.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0]!;
    throw new Error(
      `${path}: ${i.path.join(".") || "(top level)"}: ${i.message}; delete it to evaluate the job again`,
    );
  }
  return r.data;
}

export interface FinishedJob {
  summary: z.infer<typeof SummaryFile>;
  checkpoint: string;
}

/**
 * The job in `runDir` if its training finished under `config`: the same resolved config as the one
 * its config.yaml holds, a complete last checkpoint whose state `done` accepts, and its summary.
 * Otherwise why not, in a few words (the caller trains it again). A config that differs is an
 * error, not a retrain: it names the first line that differs, and the user decides.
 */
export function finishedJob(
  runDir: string,
  config: RunConfig,
  done: (state: TrainerState) => boolean,
): FinishedJob | string {
  const run = new RunDir(runDir);
  if (!existsSync(run.configPath)) return "not started";
  const want = configToYaml(config).split("\n");
  const have = readFileSync(run.configPath, "utf8").split("\n");
  const line = want.findIndex((l, i) => l !== have[i]);
  if (line >= 0 || have.length !== want.length) {
    const at = line >= 0 ? line : Math.min(want.length, have.length);
    throw new Error(
      `--resume: ${run.configPath} differs from the config this demo trains, at line ${at + 1}: ` +
        `it has ${JSON.stringify(have[at] ?? "(end)")}, this demo ${JSON.stringify(want[at] ?? "(end)")}; ` +
        "run the demo with that run's settings, or without --resume (or with another --out) to start over",
    );
  }
  const ckpt = run.latestCheckpoint();
  if (!ckpt || !done(ckpt.state)) return "not finished";
  if (!existsSync(run.summaryPath)) return "no summary.json";
  const s = SummaryFile.safeParse(JSON.parse(readFileSync(run.summaryPath, "utf8")));
  if (!s.success) return `${run.summaryPath} is not a run summary`;
  return { summary: s.data, checkpoint: ckpt.path };
}
