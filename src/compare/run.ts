// `runCompare`: a comparison as a job. Every variant of the spec is trained once per seed to the
// same budget and scored on the same held-out problems, one cell at a time (seed by seed, so the
// first seed's full comparison comes first), each cell a normal run directory under
// <out>/cells/<variant>/seed-<s>/. compare.json and compare.html are rewritten after every cell.
// Rerunning the same job skips finished cells and resumes an unfinished one from its checkpoint.
import { mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { agentSpecs } from "../config/derived.ts";
import { applyOverrides, loadRunConfig, parseRunConfig } from "../config/load.ts";
import type { RunConfig } from "../config/schema.ts";
import { MultiTaskSuite } from "../envs/multi.ts";
import { ConfigError } from "../errors.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import type { EngineHandle } from "../train/run.ts";
import { writeFileAtomic } from "../train/rundir.ts";
import { resolveRunPaths, runSuite } from "../train/suite.ts";
import { type CompareReport, METHOD, type VariantCells, variantReport } from "./aggregate.ts";
import { type Cell, type CellResult, finishedCell, runCell } from "./cell.ts";
import { renderCompareHtml } from "./html.ts";
import type { CompareSpec } from "./spec.ts";
import { configDiff, type ResolvedVariant, resolveVariant } from "./variants.ts";

export interface CompareProgress {
  cellsDone: number;
  cellsTotal: number;
  /** The cell running now. */
  current?: { variant: string; seed: number; iteration: number; sampledTokens: number; fraction: number };
  /** Seconds left, from the cells this job has run so far (null before it has a measure). */
  etaSeconds: number | null;
}

export interface CompareOptions {
  /** The directory the spec's paths are relative to. */
  specDir: string;
  /** The spec's name in the report (its file name). */
  specName: string;
  outDir: string;
  /** How a cell gets an engine (the CLI: a local engine logging into the cell, or a remote one). */
  connect: (config: RunConfig, logFile: string) => () => Promise<EngineHandle>;
  log?: (line: string) => void;
  onProgress?: (p: CompareProgress) => void;
  /** When aborted, the running cell checkpoints after its iteration and the job stops. */
  signal?: AbortSignal;
  /** Run only these variants' cells (e.g. to split a job between machines); the report has all. */
  only?: readonly string[];
}

export interface CompareOutcome {
  report: CompareReport;
  /** Stopped by the signal before every cell was done. */
  interrupted: boolean;
  jsonPath: string;
  htmlPath: string;
}

interface Plan {
  base: RunConfig;
  baseDir: string;
  variants: ResolvedVariant[];
  cells: Cell[];
  suites: Map<string, TaskSuite<unknown>>;
}

/** The base, the variants and every cell's config, validated before anything trains. */
export async function planCompare(spec: CompareSpec, specDir: string, outDir: string): Promise<Plan> {
  const baseFile = resolve(specDir, spec.base);
  const baseDir = dirname(baseFile);
  const base = resolveRunPaths(
    parseRunConfig(applyOverrides(loadRunConfig(baseFile), spec.set), `${baseFile} with the spec's set`),
    baseDir,
  );
  const variants = spec.variants.map((v) =>
    resolveVariant(
      base,
      typeof v === "string"
        ? { name: v, builtin: v, set: {} }
        : { name: v.name, builtin: v.builtin ?? "team", set: v.set },
      { neutralPrompt: spec.neutralPrompt },
    ),
  );
  const b = spec.budget;
  const cells: Cell[] = [];
  const suites = new Map<string, TaskSuite<unknown>>();
  for (const seed of spec.seeds) {
    for (const v of variants) {
      const config = parseRunConfig(
        applyOverrides(v.config, {
          name: `${v.name}-s${seed}`,
          seed,
          "train.maxSampledTokens": "sampledTokens" in b ? b.sampledTokens : null,
          "train.iterations": "sampledTokens" in b ? b.maxIterations : b.iterations,
          "train.evalAtStart": false,
          "train.checkpointEvery": spec.checkpointEvery,
          "train.keepCheckpoints": 1,
          ...(spec.eval.n !== undefined ? { "eval.n": spec.eval.n } : {}),
          ...(spec.eval.greedy !== undefined ? { "eval.greedy": spec.eval.greedy } : {}),
        }),
        `variant ${v.name} seed ${seed}`,
      );
      cells.push({
        variant: v.name,
        seed,
        config,
        untrained: v.untrained,
        dir: join(outDir, "cells", v.name, `seed-${seed}`),
      });
      if (!suites.has(v.name)) suites.set(v.name, await probedSuite(v.name, config, baseDir));
    }
  }
  return { base, baseDir, variants, cells, suites };
}

/** The variant's suite, after one episode start of each task: a team the task cannot play fails here. */
async function probedSuite(variant: string, c: RunConfig, baseDir: string): Promise<TaskSuite<unknown>> {
  try {
    const suite = runSuite(c, baseDir);
    const probes =
      suite instanceof MultiTaskSuite
        ? suite.parts.map((p, part) => ({ part, task: p.suite.train[0] }))
        : [suite.train[0]];
    for (const task of probes) {
      const env = suite.makeEnv(agentSpecs(c), c.graph);
      await env.reset(task, 0);
      env.ready();
    }
    return suite;
  } catch (e) {
    if (e instanceof ConfigError) throw e;
    throw new ConfigError(
      `variant ${variant}`,
      [`the task does not accept this team: ${(e as Error).message}`],
      "invalid variant",
    );
  }
}

export async function runCompare(spec: CompareSpec, o: CompareOptions): Promise<CompareOutcome> {
  const plan = await planCompare(spec, o.specDir, o.outDir);
  const log = o.log ?? (() => {});
  const unknown = (o.only ?? []).filter((n) => !plan.variants.some((v) => v.name === n));
  if (unknown.length > 0) {
    throw new ConfigError(
      "--only",
      [`no variant ${unknown.join(", ")} in the spec (${plan.variants.map((v) => v.name).join(", ")})`],
      "invalid option",
    );
  }
  const todo = plan.cells.filter((c) => !o.only || o.only.includes(c.variant));
  mkdirSync(o.outDir, { recursive: true });
  const results = new Map<string, Map<number, CellResult>>(plan.variants.map((v) => [v.name, new Map()]));
  for (const cell of plan.cells) {
    const r = finishedCell(cell);
    if (r) results.get(cell.variant)!.set(cell.seed, r);
  }
  const jsonPath = join(o.outDir, "compare.json");
  const htmlPath = join(o.outDir, "compare.html");
  const write = () => {
    const report = compareReport(spec, o.specName, plan, results);
    writeFileAtomic(jsonPath, `${JSON.stringify(report, null, 1)}\n`);
    writeFileAtomic(htmlPath, renderCompareHtml(report));
    return report;
  };

  const total = todo.length;
  let done = todo.filter((c) => results.get(c.variant)!.has(c.seed)).length;
  if (done > 0) log(`${done} of ${total} cells already finished in ${o.outDir}: not recomputed`);
  const ran: number[] = []; // seconds of the cells run by this job
  let interrupted = false;
  for (const cell of todo) {
    if (results.get(cell.variant)!.has(cell.seed)) continue;
    if (o.signal?.aborted) {
      interrupted = true;
      break;
    }
    const t0 = performance.now();
    const budget = cell.config.train.maxSampledTokens;
    const progress = (iteration: number, sampledTokens: number) => {
      const fraction = cell.untrained
        ? 0
        : Math.min(1, budget !== null ? sampledTokens / budget : iteration / cell.config.train.iterations);
      const elapsed = (performance.now() - t0) / 1000;
      const perCell = ran.length
        ? ran.reduce((a, b) => a + b, 0) / ran.length
        : fraction > 0.05
          ? elapsed / fraction
          : null;
      const left = total - done - 1;
      const eta = perCell === null ? null : Math.max(0, perCell - elapsed) + left * perCell;
      o.onProgress?.({
        cellsDone: done,
        cellsTotal: total,
        current: { variant: cell.variant, seed: cell.seed, iteration, sampledTokens, fraction },
        etaSeconds: eta,
      });
    };
    progress(0, 0);
    const r = await runCell(cell, {
      connect: o.connect,
      suite: plan.suites.get(cell.variant)!,
      configDir: plan.baseDir,
      log: (line) => log(`${cell.variant} seed ${cell.seed}: ${line}`),
      onIteration: progress,
      signal: o.signal,
    });
    if (!r) {
      interrupted = true;
      break;
    }
    ran.push((performance.now() - t0) / 1000);
    results.get(cell.variant)!.set(cell.seed, r);
    done++;
    write();
    o.onProgress?.({
      cellsDone: done,
      cellsTotal: total,
      etaSeconds: ran.length ? (total - done) * (ran.reduce((a, b) => a + b, 0) / ran.length) : null,
    });
  }
  const report = write();
  return { report, interrupted, jsonPath, htmlPath };
}

/** compare.json from the finished cells. */
function compareReport(
  spec: CompareSpec,
  specName: string,
  plan: Plan,
  results: ReadonlyMap<string, ReadonlyMap<number, CellResult>>,
): CompareReport {
  const b = spec.budget;
  const budget =
    "sampledTokens" in b
      ? { sampledTokens: b.sampledTokens, maxIterations: b.maxIterations }
      : { iterations: b.iterations };
  const first = plan.variants[0]!;
  const cellsOf = (v: ResolvedVariant): VariantCells => ({
    name: v.name,
    about: v.about,
    changes: configDiff(first.config, v.config),
    untrained: v.untrained,
    cells: new Map(results.get(v.name)!),
  });
  const firstCells = cellsOf(first);
  const variants = plan.variants.map((v, i) =>
    variantReport(cellsOf(v), spec.seeds, i === 0 ? null : firstCells, budget),
  );
  const c0 = plan.cells[0]!.config;
  const all = [...results.values()].flatMap((m) => [...m.values()]);
  return {
    spec: specName,
    base: spec.base,
    budget,
    seeds: spec.seeds,
    eval: { n: c0.eval.n || null, greedy: c0.eval.greedy },
    complete: variants.every((v) => v.missing.length === 0),
    method: METHOD,
    provenance: {
      commits: [...new Set(all.map((c) => c.provenance?.commit ?? "unknown"))],
      hosts: [...new Set(all.map((c) => c.provenance?.host ?? "unknown"))],
    },
    variants,
  };
}

/** Where `marft compare SPEC` writes by default: runs/compare/<spec file name without .yaml>. */
export function defaultOutDir(specFile: string): string {
  const name = specFile.replace(/^.*\//, "").replace(/\.ya?ml$/, "");
  return resolve("runs", "compare", name);
}
