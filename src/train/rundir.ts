// The run directory (DESIGN §6):
//   runs/<name>/config.yaml  metrics.jsonl  engine.log  checkpoints/iter_<n>/  checkpoints/latest  summary.json
// Checkpoints are written to a temporary directory and renamed into place, and `latest` is replaced
// atomically, so a crash at any moment leaves either the old or the new checkpoint, never half of one.
import { randomBytes } from "node:crypto";
import {
  appendFileSync,
  closeSync,
  existsSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { join, resolve } from "node:path";
import { z } from "zod";
import { DataError } from "../errors.ts";
import type { RngState } from "../rng.ts";
import type { MetricsRow } from "./phases.ts";

// JSON has no NaN: JSON.stringify writes a NaN metric (the critic's explained variance when every
// return of the batch is equal) as null, so null reads back as NaN.
const MetricsRowSchema = z.record(z.string(), z.union([z.number(), z.null().transform(() => Number.NaN)]));

/** Write a file so that readers see the old content or the new one, never a torn write. */
export function writeFileAtomic(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  const fd = openSync(tmp, "w");
  try {
    writeFileSync(fd, text);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
}

/** What the trainer needs, besides the engine's state, to continue exactly where it stopped. */
export interface TrainerState {
  /** Iterations completed; the next iteration to run has this index. */
  iteration: number;
  /** Position in the endless shuffled stream of training tasks. */
  dataCursor: number;
  rng: RngState;
  /** ZeroAdvantageDetector counts, per agent. */
  zeroAdvantageBatches: Record<string, number>;
  /** Lines of metrics.jsonl written up to this checkpoint; resume truncates to it. */
  metricsLines: number;
  /** Adapter versions at save time. */
  adapterVersions: Record<string, number>;
}

export class RunDir {
  readonly root: string;
  constructor(root: string) {
    this.root = resolve(root);
  }
  get configPath(): string {
    return join(this.root, "config.yaml");
  }
  get metricsPath(): string {
    return join(this.root, "metrics.jsonl");
  }
  get engineLogPath(): string {
    return join(this.root, "engine.log");
  }
  get checkpointsDir(): string {
    return join(this.root, "checkpoints");
  }
  get summaryPath(): string {
    return join(this.root, "summary.json");
  }
  checkpointPath(iteration: number): string {
    return join(this.checkpointsDir, `iter_${iteration}`);
  }

  create(): void {
    mkdirSync(this.checkpointsDir, { recursive: true });
  }

  appendMetrics(row: MetricsRow): void {
    appendFileSync(this.metricsPath, `${JSON.stringify(row)}\n`);
  }

  /** The metrics rows (each a flat object of numbers); a line that is not one names the file and line. */
  readMetrics(): MetricsRow[] {
    if (!existsSync(this.metricsPath)) return [];
    const rows: MetricsRow[] = [];
    readFileSync(this.metricsPath, "utf8")
      .split("\n")
      .forEach((l, i) => {
        if (l.trim() === "") return;
        let value: unknown;
        try {
          value = JSON.parse(l);
        } catch (e) {
          throw new DataError(`${this.metricsPath}:${i + 1}: not JSON (${(e as Error).message})`);
        }
        const r = MetricsRowSchema.safeParse(value);
        if (!r.success) throw new DataError(`${this.metricsPath}:${i + 1}: not a metrics row of numbers`);
        rows.push(r.data);
      });
    return rows;
  }

  metricsLineCount(): number {
    return this.readMetrics().length;
  }

  /** Keep the first n lines (the ones a checkpoint vouches for); later lines are replayed. */
  truncateMetrics(n: number): void {
    const kept = this.readMetrics().slice(0, n);
    writeFileAtomic(this.metricsPath, kept.map((r) => `${JSON.stringify(r)}\n`).join(""));
  }

  /**
   * Write checkpoints/iter_<n>: `saveEngine(dir)` asks the engine to save adapters, critic, optimizer
   * and RNG into `dir`; the trainer's state goes next to it. All of it lands in a temporary
   * directory first and is renamed into place; then `latest` moves to it; then old ones are pruned.
   */
  async writeCheckpoint(
    state: TrainerState,
    saveEngine: (engineDir: string) => Promise<void>,
    keep: number,
  ): Promise<string> {
    this.create();
    const final = this.checkpointPath(state.iteration);
    const tmp = join(this.checkpointsDir, `.tmp-iter_${state.iteration}-${randomBytes(4).toString("hex")}`);
    mkdirSync(tmp);
    try {
      await saveEngine(join(tmp, "engine"));
      writeFileAtomic(join(tmp, "trainer.json"), `${JSON.stringify(state, null, 1)}\n`);
      if (existsSync(final)) rmSync(final, { recursive: true, force: true });
      renameSync(tmp, final);
    } catch (e) {
      rmSync(tmp, { recursive: true, force: true });
      throw e;
    }
    writeFileAtomic(join(this.checkpointsDir, "latest"), `iter_${state.iteration}\n`);
    this.prune(keep);
    return final;
  }

  /** Complete checkpoints (those with trainer.json), oldest first. */
  listCheckpoints(): Array<{ iteration: number; path: string }> {
    if (!existsSync(this.checkpointsDir)) return [];
    return readdirSync(this.checkpointsDir)
      .map((n) => /^iter_(\d+)$/.exec(n))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => ({ iteration: Number(m[1]), path: join(this.checkpointsDir, m[0]) }))
      .filter((c) => existsSync(join(c.path, "trainer.json")))
      .sort((a, b) => a.iteration - b.iteration);
  }

  /** The checkpoint `latest` points to, or the newest complete one if the pointer is missing. */
  latestCheckpoint(): { path: string; state: TrainerState } | undefined {
    const pointer = join(this.checkpointsDir, "latest");
    let path: string | undefined;
    if (existsSync(pointer)) {
      const p = join(this.checkpointsDir, readFileSync(pointer, "utf8").trim());
      if (existsSync(join(p, "trainer.json"))) path = p;
    }
    path ??= this.listCheckpoints().at(-1)?.path;
    if (!path) return undefined;
    const state = JSON.parse(readFileSync(join(path, "trainer.json"), "utf8")) as TrainerState;
    return { path, state };
  }

  private prune(keep: number): void {
    const all = this.listCheckpoints();
    for (const c of all.slice(0, Math.max(0, all.length - keep)))
      rmSync(c.path, { recursive: true, force: true });
    // leftovers of a crash in the middle of a save
    for (const n of readdirSync(this.checkpointsDir)) {
      if (n.startsWith(".tmp-")) rmSync(join(this.checkpointsDir, n), { recursive: true, force: true });
    }
  }
}
