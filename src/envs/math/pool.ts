// A small pool of worker threads for the symbolic answer check. Each job gets a time limit; a worker
// that overruns it is terminated (the only way to stop synchronous JS) and replaced on demand.
// Jobs wait in a queue while every worker is busy, so the rollout's event loop is never blocked.
import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";

export interface SymbolicPair {
  /** mathjs expressions (from latexToExpr) */
  a: string;
  b: string;
  /** compare as equations: a = 0 and b = 0 up to a constant factor */
  eq: boolean;
}

export type SymbolicResult = { ok: true; results: boolean[] } | { ok: false; reason: string };

interface Job {
  id: number;
  pairs: SymbolicPair[];
  timeoutMs: number;
  resolve: (r: SymbolicResult) => void;
}

interface Slot {
  worker: Worker;
  ready: boolean;
  job: Job | null;
  timer: NodeJS.Timeout | null;
}

const WORKER_URL = new URL("./symbolic-worker.mjs", import.meta.url);
/** A worker that cannot even load mathjs in this time is broken; its jobs fail instead of waiting forever. */
const STARTUP_LIMIT_MS = 30_000;

export class SymbolicPool {
  private readonly slots: Slot[] = [];
  private readonly queue: Job[] = [];
  private nextId = 0;
  private closed = false;

  /**
   * @param size most workers at once (default: the cores but one, at most 4)
   * @param workerUrl the worker script (tests pass one that never answers, to test the time limit)
   */
  constructor(
    readonly size = Math.max(1, Math.min(4, availableParallelism() - 1)),
    private readonly workerUrl: URL = WORKER_URL,
  ) {}

  /** Runs the pairs in a worker; resolves (never rejects) with the verdicts or why there are none. */
  run(pairs: SymbolicPair[], timeoutMs: number): Promise<SymbolicResult> {
    if (this.closed) return Promise.resolve({ ok: false, reason: "pool closed" });
    return new Promise((resolve) => {
      this.queue.push({ id: this.nextId++, pairs, timeoutMs, resolve });
      this.pump();
    });
  }

  /** Terminates every worker; pending jobs resolve with reason "pool closed". */
  async close(): Promise<void> {
    this.closed = true;
    for (const job of this.queue.splice(0)) job.resolve({ ok: false, reason: "pool closed" });
    await Promise.all(this.slots.splice(0).map((s) => this.kill(s, "pool closed")));
  }

  private pump(): void {
    while (this.queue.length > 0) {
      const free = this.slots.find((s) => s.ready && s.job === null);
      if (free) {
        this.dispatch(free, this.queue.shift()!);
        continue;
      }
      // start another worker only if every existing one is busy (not merely starting up)
      if (this.slots.length < this.size && this.slots.every((s) => s.ready)) this.spawn();
      return;
    }
  }

  private spawn(): void {
    const worker = new Worker(this.workerUrl, {
      // an answer that allocates without bound hits this instead of the process's memory
      resourceLimits: { maxOldGenerationSizeMb: 256, stackSizeMb: 4 },
    });
    const slot: Slot = { worker, ready: false, job: null, timer: null };
    this.slots.push(slot);
    slot.timer = setTimeout(() => this.fail(slot, "symbolic worker did not start"), STARTUP_LIMIT_MS);
    worker.on("message", (msg: { ready?: boolean; id?: number; results?: boolean[]; error?: string }) => {
      if (msg.ready) {
        slot.ready = true;
        this.clearTimer(slot);
        worker.unref(); // an idle pool must not keep the process alive
        this.pump();
        return;
      }
      const job = slot.job;
      if (!job || msg.id !== job.id) return;
      this.clearTimer(slot);
      slot.job = null;
      worker.unref();
      job.resolve(
        msg.results ? { ok: true, results: msg.results } : { ok: false, reason: msg.error ?? "error" },
      );
      this.pump();
    });
    worker.on("error", (e) => this.fail(slot, `symbolic worker crashed: ${e.message}`));
    worker.on("exit", () => this.fail(slot, "symbolic worker exited"));
  }

  private dispatch(slot: Slot, job: Job): void {
    slot.job = job;
    slot.worker.ref();
    slot.timer = setTimeout(() => this.fail(slot, `timeout after ${job.timeoutMs} ms`), job.timeoutMs);
    slot.worker.postMessage({ id: job.id, pairs: job.pairs });
  }

  /** Drops a slot: its job (if any) fails with `reason`; a fresh worker starts when needed. */
  private fail(slot: Slot, reason: string): void {
    const i = this.slots.indexOf(slot);
    if (i < 0) return;
    this.slots.splice(i, 1);
    const job = slot.job;
    slot.job = null;
    void this.kill(slot, reason);
    if (job) job.resolve({ ok: false, reason });
    else if (!slot.ready) {
      // the worker never started: fail the queue rather than spawn forever
      for (const j of this.queue.splice(0)) j.resolve({ ok: false, reason });
    }
    this.pump();
  }

  private async kill(slot: Slot, _reason: string): Promise<void> {
    this.clearTimer(slot);
    slot.worker.removeAllListeners();
    slot.worker.on("error", () => {}); // errors after termination are expected and uninteresting
    await slot.worker.terminate();
  }

  private clearTimer(slot: Slot): void {
    if (slot.timer) clearTimeout(slot.timer);
    slot.timer = null;
  }
}

let shared: SymbolicPool | null = null;

/** The process-wide pool that gradeAnswer uses by default (created on first use). */
export function sharedSymbolicPool(): SymbolicPool {
  shared ??= new SymbolicPool();
  return shared;
}

/** Stops the shared pool's workers (tests and CLI commands call this before exiting). */
export async function closeSharedSymbolicPool(): Promise<void> {
  const p = shared;
  shared = null;
  if (p) await p.close();
}
