// The run directory (DESIGN §6):
//   runs/<name>/config.yaml  metrics.jsonl  transcripts.jsonl  engine.log  checkpoints/iter_<n>/
//               checkpoints/latest  summary.json  report.html  tensorboard/  trainer.lock (while a trainer uses it)
// Checkpoints are written to a temporary directory and renamed into place, and `latest` is replaced
// atomically, so a crash at any moment leaves either the old or the new checkpoint, never half of one;
// what a crash leaves behind (temporary directories and files, a torn last metrics line) is cleared
// by the next trainer, which holds the directory's lock while it runs.
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
import { hostname } from "node:os";
import { join, resolve } from "node:path";
import { z } from "zod";
import { DataError, RunLockedError } from "../errors.ts";
import type { RngState } from "../rng.ts";
import type { MetricsRow } from "./phases.ts";

import type { ReplayState } from "./replay.ts";
import type { SchedulerState } from "./task-source.ts";

const MetricsRowSchema = z.record(z.string(), z.number());

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
  /** Tokens the training rollouts of the completed iterations sampled (train.maxSampledTokens counts them). */
  sampledTokens?: number;
  /** Multi-task runs: the task scheduler (its PRNG, the tasks' cursors and reward averages). */
  scheduler?: SchedulerState;
  /** train.async: the rollout seeds' PRNG (they do not come from `rng` there). */
  rolloutRng?: RngState;
  /** Experience replay: the buffer (written next to trainer.json as replay.json). */
  replay?: ReplayState;
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
  get transcriptsPath(): string {
    return join(this.root, "transcripts.jsonl");
  }
  get tensorboardDir(): string {
    return join(this.root, "tensorboard");
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
  get lockPath(): string {
    return join(this.root, "trainer.lock");
  }
  checkpointPath(iteration: number): string {
    return join(this.checkpointsDir, `iter_${iteration}`);
  }

  create(): void {
    mkdirSync(this.checkpointsDir, { recursive: true });
  }

  /**
   * One line per iteration. A non-finite value (the mean of nothing, say) is left out of the line,
   * as metrics that do not apply to an iteration are: JSON would write it as null, and a line of
   * metrics.jsonl that is not all numbers stops every later reader, resume among them.
   */
  appendMetrics(row: MetricsRow): void {
    const finite = Object.fromEntries(Object.entries(row).filter(([, v]) => Number.isFinite(v)));
    appendFileSync(this.metricsPath, `${JSON.stringify(finite)}\n`);
  }

  /**
   * The complete lines of metrics.jsonl. A last line without its newline is the torn end of an
   * append a crash cut short: not a line (the next trainer truncates it away).
   */
  private metricsText(): string[] {
    if (!existsSync(this.metricsPath)) return [];
    const lines = readFileSync(this.metricsPath, "utf8").split("\n");
    lines.pop(); // what follows the last newline: "" for a whole file, else the torn line
    return lines;
  }

  /** The metrics rows (each a flat object of numbers); a line that is not one names the file and line. */
  readMetrics(): MetricsRow[] {
    const rows: MetricsRow[] = [];
    this.metricsText().forEach((l, i) => {
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

  /** Keep the first n lines (the ones a checkpoint vouches for); later and torn lines go. */
  truncateMetrics(n: number): void {
    const rows = this.readMetrics();
    if (rows.length < n)
      throw new DataError(`${this.metricsPath}: ${rows.length} lines, but the checkpoint vouches for ${n}`);
    writeFileAtomic(
      this.metricsPath,
      rows
        .slice(0, n)
        .map((r) => `${JSON.stringify(r)}\n`)
        .join(""),
    );
  }

  /**
   * Remove what an interrupted trainer left: temporary checkpoint directories and the temporary
   * files of atomic writes. Only while holding the lock (nobody else writes them then). Returns
   * their names.
   */
  removeLeftovers(): string[] {
    const removed: string[] = [];
    for (const dir of [this.root, this.checkpointsDir]) {
      if (!existsSync(dir)) continue;
      for (const n of readdirSync(dir)) {
        if (n.startsWith(".tmp-") || /\.tmp-/.test(n)) {
          rmSync(join(dir, n), { recursive: true, force: true });
          removed.push(join(dir, n));
        }
      }
    }
    return removed;
  }

  // -------------------------------------------------------------------------------------------------
  // The lock: one trainer per run directory.

  /**
   * Take the run directory for this process; a live holder is refused with RunLockedError naming
   * its PID. A lock whose holder is gone (killed) is stale: its engine, if still running, is stopped
   * (it may still be writing a checkpoint), then the lock is taken over. Returns the release.
   */
  async lock(log: (line: string) => void = () => {}): Promise<() => void> {
    this.create();
    const mine: LockInfo = { pid: process.pid, started: processStart(process.pid), host: hostname() };
    for (let attempt = 0; ; attempt++) {
      try {
        const fd = openSync(this.lockPath, "wx");
        try {
          writeFileSync(fd, `${JSON.stringify(mine)}\n`);
          fsyncSync(fd);
        } finally {
          closeSync(fd);
        }
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "EEXIST" || attempt > 0) throw e;
      }
      const holder = this.lockHolder();
      if (holder && holderAlive(holder)) {
        throw new RunLockedError(
          `${this.root} is in use by another trainer (PID ${holder.pid} on ${holder.host}); ` +
            `wait for it to finish, or stop it (kill ${holder.pid}) and resume`,
        );
      }
      if (holder?.enginePid !== undefined && (await stopOrphanEngine(holder.enginePid)))
        log(`stopped engine ${holder.enginePid}, left running by trainer ${holder.pid}, which is gone`);
      rmSync(this.lockPath, { force: true });
    }
    const release = () => {
      if (this.lockHolder()?.pid === process.pid) rmSync(this.lockPath, { force: true });
      process.off("exit", release);
    };
    process.on("exit", release);
    return release;
  }

  /** Note the engine this trainer started in its lock, so that a successor can stop an orphan. */
  recordEngine(enginePid: number | undefined): void {
    const holder = this.lockHolder();
    if (holder?.pid !== process.pid) return;
    writeFileAtomic(this.lockPath, `${JSON.stringify({ ...holder, enginePid })}\n`);
  }

  private lockHolder(): LockInfo | undefined {
    try {
      const v = JSON.parse(readFileSync(this.lockPath, "utf8")) as Partial<LockInfo>;
      if (typeof v.pid !== "number") return undefined;
      return {
        pid: v.pid,
        started: typeof v.started === "string" ? v.started : undefined,
        host: typeof v.host === "string" ? v.host : "",
        ...(typeof v.enginePid === "number" ? { enginePid: v.enginePid } : {}),
      };
    } catch {
      return undefined; // missing, or torn by a crash while being written: nobody's
    }
  }

  /**
   * An iteration's transcript records in one append, so a reader (or a crash) sees whole iterations
   * and at worst a torn last line, which readers skip and truncation drops.
   */
  appendTranscripts<T extends { iteration: number }>(records: readonly T[]): void {
    if (records.length === 0) return;
    appendFileSync(this.transcriptsPath, records.map((r) => `${JSON.stringify(r)}\n`).join(""));
  }

  /** Keep the records of iterations 1..n (the ones a checkpoint vouches for); later ones are replayed. */
  truncateTranscripts(n: number): void {
    if (!existsSync(this.transcriptsPath)) return;
    const lines = readFileSync(this.transcriptsPath, "utf8").split("\n");
    lines.pop(); // "" after the last newline, or a torn line a crash left
    const kept = lines.filter((line, i) => {
      let iteration: unknown;
      try {
        iteration = (JSON.parse(line) as { iteration?: unknown }).iteration;
      } catch {
        // only the last line can be torn (one append per iteration); any other is a damaged file
      }
      if (typeof iteration !== "number") {
        throw new Error(`${this.transcriptsPath}:${i + 1}: not a transcript record with an iteration number`);
      }
      return iteration <= n;
    });
    writeFileAtomic(this.transcriptsPath, kept.map((l) => `${l}\n`).join(""));
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
      // the replay buffer holds token ids and log-probs of many turns: its own file, one line
      const { replay, ...rest } = state;
      if (replay) writeFileAtomic(join(tmp, "replay.json"), `${JSON.stringify(replay)}\n`);
      writeFileAtomic(join(tmp, "trainer.json"), `${JSON.stringify(rest, null, 1)}\n`);
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
    const replay = join(path, "replay.json");
    if (existsSync(replay)) state.replay = JSON.parse(readFileSync(replay, "utf8")) as ReplayState;
    return { path, state };
  }

  /** Where the latest complete checkpoint is, for messages. */
  latestCheckpointInfo(): { path: string; iteration: number } | undefined {
    const c = this.latestCheckpoint();
    return c ? { path: c.path, iteration: c.state.iteration } : undefined;
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

interface LockInfo {
  pid: number;
  /** The process's start time (from /proc), so that a reused PID is not taken for the holder. */
  started: string | undefined;
  host: string;
  enginePid?: number;
}

/** Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); undefined off Linux. */
function processStart(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}

function holderAlive(h: LockInfo): boolean {
  if (h.host !== hostname()) return true; // another machine's process: we cannot tell, so it is
  try {
    process.kill(h.pid, 0);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ESRCH") return false;
  }
  const started = processStart(h.pid);
  return h.started === undefined || started === undefined || started === h.started;
}

/** SIGKILL an engine a dead trainer left (it exits by itself soon, but may be writing until then). */
async function stopOrphanEngine(pid: number): Promise<boolean> {
  let cmdline = "";
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
  } catch {
    return false;
  }
  if (!cmdline.includes("marft_engine.server")) return false;
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    return false;
  }
  for (let i = 0; i < 100; i++) {
    let state: string | undefined;
    try {
      state = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0];
    } catch {
      break; // gone
    }
    if (state === "Z") break; // dead; init reaps it
    await new Promise((r) => setTimeout(r, 50));
  }
  return true;
}
