// `marft compare SPEC.yaml [--out DIR]`: every variant of the spec, every seed, the same budget; a
// table on stdout, compare.json and compare.html in the out directory. Rerun the same command to
// continue an interrupted job: finished cells are never recomputed.
import { loadCompareSpec } from "../compare/spec.ts";
import { compareRows, perTaskRows } from "../compare/table.ts";
import { defaultOutDir, runCompare } from "../compare/run.ts";
import { parseCommand } from "./args.ts";
import { Progress, table } from "./progress.ts";
import { engineConnector, reportError } from "./train.ts";
import { resolve } from "node:path";

const USAGE = `usage: marft compare <spec.yaml> [options]

Trains every variant of the spec at every seed to the same budget and compares them on the same
held-out problems (configs/compare-*.yaml are examples; README "Comparing variants").

options:
  --out DIR                where the cells, compare.json and compare.html go (default: runs/compare/<spec name>)
  --only A,B               run only these variants' cells (the report shows every variant)
  --engine-url URL         use a running engine instead of starting one per cell
  --engine-token-env VAR   environment variable with that engine's token (default MARFT_ENGINE_TOKEN)
  --quiet                  no progress
`;

function duration(s: number | null): string {
  if (s === null) return "eta ?";
  const m = Math.floor(s / 60);
  return m >= 60
    ? `eta ${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`
    : `eta ${m}m${String(Math.round(s % 60)).padStart(2, "0")}s`;
}

export async function compareCommand(args: string[]): Promise<void> {
  const parsed = parseCommand(
    "compare",
    USAGE,
    args,
    {
      out: { type: "string" },
      only: { type: "string" },
      "engine-url": { type: "string" },
      "engine-token-env": { type: "string" },
      quiet: { type: "boolean" },
    },
    { positionals: "expected one spec file" },
  );
  if (!parsed) return;
  const { values, positionals } = parsed;
  const abort = new AbortController();
  const onSigint = () => {
    if (abort.signal.aborted) process.exit(130);
    process.stderr.write(
      "\nCtrl-C: checkpointing the running cell after this iteration (Ctrl-C again to quit now)\n",
    );
    abort.abort();
  };
  process.on("SIGINT", onSigint);
  process.on("SIGTERM", onSigint);
  let heartbeat: NodeJS.Timeout | undefined;
  try {
    const file = positionals[0]!;
    const { spec, dir } = loadCompareSpec(file);
    const outDir = resolve(values.out ?? defaultOutDir(file));
    const bar = new Progress("compare", 0, { silent: values.quiet, plainEveryMs: 30_000 });
    let last = { done: 0, total: 0, extra: "" };
    const render = () => bar.update(last.done, last.extra, last.total);
    heartbeat = setInterval(render, 5_000); // plain lines still print at most every 30 s
    heartbeat.unref();
    const tty = Boolean(process.stderr.isTTY);
    const out = await runCompare(spec, {
      specDir: dir,
      specName: file.replace(/^.*\//, ""),
      outDir,
      connect: (config, logFile) =>
        engineConnector(config, logFile, { url: values["engine-url"], tokenEnv: values["engine-token-env"] }),
      signal: abort.signal,
      ...(values.only ? { only: values.only.split(",").map((x) => x.trim()) } : {}),
      log: (line) => process.stderr.write(`${tty && !values.quiet ? "\n" : ""}${line}\n`),
      onProgress: (p) => {
        const c = p.current;
        const now = c
          ? `${c.variant} seed ${c.seed}: iteration ${c.iteration}, ${c.sampledTokens} tokens (${Math.round(100 * c.fraction)}%)`
          : "";
        last = {
          done: p.cellsDone,
          total: p.cellsTotal,
          extra: `cells, ${p.cellsTotal - p.cellsDone} left, ${duration(p.etaSeconds)}  ${now}`,
        };
        render();
      },
    });
    bar.finish();
    const { header, rows } = compareRows(out.report);
    process.stdout.write(`\n${table(rows, header)}`);
    const tasks = perTaskRows(out.report);
    if (tasks) process.stdout.write(`\nheld-out accuracy per task\n${table(tasks.rows, tasks.header)}`);
    const b = out.report.budget;
    process.stdout.write(
      `budget: ${b.sampledTokens !== undefined ? `${b.sampledTokens} sampled tokens` : `${b.iterations} iterations`} per cell; seeds ${out.report.seeds.join(", ")}\n` +
        `cells computed with commit ${out.report.provenance.commits.join(", ")} on ${out.report.provenance.hosts.join(", ")}\n` +
        `wrote ${out.jsonPath} and ${out.htmlPath}\n`,
    );
    if (out.interrupted)
      process.stdout.write(
        `interrupted; rerun the same command to continue: marft compare ${file}${values.out ? ` --out ${values.out}` : ""}\n`,
      );
  } catch (e) {
    reportError("compare", e);
  } finally {
    if (heartbeat) clearInterval(heartbeat);
    process.off("SIGINT", onSigint);
    process.off("SIGTERM", onSigint);
  }
}
