// A pool of long-lived Python processes running Math-Verify (engine/marft_engine/math_verify_worker.py),
// JSONL over stdin/stdout. Each answer has a time limit, enforced here: a worker that overruns it is
// killed and a fresh one starts on demand (Python cannot be trusted to interrupt sympy by itself).
// The pool never rejects: a failure is { ok: false, reason }, and the grader then keeps the
// TypeScript checker's verdict. If the workers cannot start at all (no Python, math-verify not
// installed), the pool says so once and answers "unavailable" from then on, without retrying.
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { availableParallelism } from "node:os";
import { fileURLToPath } from "node:url";
import { z } from "zod";

export interface MathVerifyRequest {
  gold: string;
  pred: string;
  /** false (default): both are extracted answers; true: both are free text (the bench) */
  raw?: boolean;
  /** pred alone is free text (a whole response), gold an answer */
  pred_raw?: boolean;
  /** Math-Verify's float_rounding (default 6) */
  precision?: number;
  strict?: boolean;
  allow_set_relation_comp?: boolean;
  match_types?: Array<"latex" | "expr">;
}

export type MathVerifyResult = { ok: true; equal: boolean } | { ok: false; reason: string };

export interface MathVerifyPoolOptions {
  /** most worker processes at once (default: the cores but one, at most 4) */
  size?: number;
  /** the Python interpreter (default: $MARFT_PYTHON, else the repository's .venv/bin/python) */
  python?: string;
  /** the worker script (tests pass one that hangs or fails to start) */
  script?: string;
  /** a worker that has not said it is ready in this time is broken (default 60 s: sympy imports slowly) */
  startupMs?: number;
}

interface Job {
  id: number;
  req: MathVerifyRequest;
  timeoutMs: number;
  resolve: (r: MathVerifyResult) => void;
}

interface Slot {
  child: ChildProcessWithoutNullStreams;
  ready: boolean;
  job: Job | null;
  timer: NodeJS.Timeout | null;
  buffer: string;
}

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
const DEFAULT_SCRIPT = `${ROOT}engine/marft_engine/math_verify_worker.py`;

/** The interpreter that has math-verify: $MARFT_PYTHON, else the repository's virtual environment. */
export function defaultPython(): string {
  const env = process.env.MARFT_PYTHON;
  if (env) return env;
  const venv = `${ROOT}.venv/bin/python`;
  return existsSync(venv) ? venv : "python3";
}

const Ready = z.object({ ready: z.boolean(), version: z.string().optional(), error: z.string().optional() });
const Answer = z.object({ id: z.number(), equal: z.boolean(), error: z.string().optional() });

export class MathVerifyPool {
  readonly size: number;
  private readonly python: string;
  private readonly script: string;
  private readonly startupMs: number;
  private readonly slots: Slot[] = [];
  private readonly queue: Job[] = [];
  private nextId = 0;
  private closed = false;
  /** Set once when a worker fails to start: the pool is then unavailable for good. */
  private broken: string | null = null;
  /** Math-Verify's version, once a worker has started. */
  version: string | null = null;

  constructor(opts: MathVerifyPoolOptions = {}) {
    this.size = opts.size ?? Math.max(1, Math.min(4, availableParallelism() - 1));
    this.python = opts.python ?? defaultPython();
    this.script = opts.script ?? DEFAULT_SCRIPT;
    this.startupMs = opts.startupMs ?? 60_000;
  }

  /** Why the pool cannot answer (null while it can, or may). */
  get unavailable(): string | null {
    return this.closed ? "pool closed" : this.broken;
  }

  /** Judges one pair; resolves (never rejects) with the verdict or why there is none. */
  verify(req: MathVerifyRequest, timeoutMs: number): Promise<MathVerifyResult> {
    const why = this.unavailable;
    if (why) return Promise.resolve({ ok: false, reason: `math-verify unavailable: ${why}` });
    return new Promise((resolve) => {
      this.queue.push({ id: this.nextId++, req, timeoutMs, resolve });
      this.pump();
    });
  }

  /** Starts the workers now (the first answers then do not wait for Python to import sympy). */
  warm(): void {
    while (!this.unavailable && this.slots.length < this.size) this.spawn();
  }

  /** Kills every worker; queued jobs resolve with reason "pool closed". */
  async close(): Promise<void> {
    this.closed = true;
    for (const job of this.queue.splice(0)) job.resolve({ ok: false, reason: "pool closed" });
    const slots = this.slots.splice(0);
    for (const s of slots) {
      if (s.job) s.job.resolve({ ok: false, reason: "pool closed" });
      s.job = null;
    }
    await Promise.all(slots.map((s) => this.kill(s)));
  }

  private pump(): void {
    while (this.queue.length > 0) {
      const free = this.slots.find((s) => s.ready && s.job === null);
      if (free) {
        this.dispatch(free, this.queue.shift()!);
        continue;
      }
      // another worker only when every existing one is busy (not merely starting up)
      if (this.slots.length < this.size && this.slots.every((s) => s.ready)) this.spawn();
      return;
    }
  }

  private spawn(): void {
    const child = spawn(this.python, ["-u", this.script], { stdio: ["pipe", "pipe", "pipe"] });
    const slot: Slot = { child, ready: false, job: null, timer: null, buffer: "" };
    this.slots.push(slot);
    slot.timer = setTimeout(
      () => this.startFailed(slot, "math-verify worker did not start in time"),
      this.startupMs,
    );
    let stderr = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d: string) => {
      stderr = (stderr + d).slice(-2000); // the last words of a worker that dies on start
    });
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (d: string) => {
      slot.buffer += d;
      for (let nl = slot.buffer.indexOf("\n"); nl >= 0; nl = slot.buffer.indexOf("\n")) {
        const line = slot.buffer.slice(0, nl);
        slot.buffer = slot.buffer.slice(nl + 1);
        this.onLine(slot, line);
      }
    });
    child.on("error", (e) => this.startFailedOrCrash(slot, `math-verify worker: ${e.message}`));
    child.on("exit", (code, signal) => {
      const last = stderr.trim().split("\n").slice(-1)[0] ?? "";
      this.startFailedOrCrash(
        slot,
        `math-verify worker exited (${signal ?? code})${last ? `: ${last}` : ""}`,
      );
    });
    child.stdin.on("error", () => {}); // a write to a dying worker: its exit event reports it
    // a starting worker keeps the process alive (jobs may be waiting for it); once ready, only while busy
  }

  private onLine(slot: Slot, line: string): void {
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      return; // stray output of a library; answers are whole JSON lines
    }
    if (!slot.ready) {
      const r = Ready.safeParse(value);
      if (!r.success) return;
      if (!r.data.ready) {
        this.startFailed(slot, r.data.error ?? "math-verify worker refused to start");
        return;
      }
      slot.ready = true;
      this.version = r.data.version ?? null;
      this.clearTimer(slot);
      this.idle(slot);
      this.pump();
      return;
    }
    const a = Answer.safeParse(value);
    const job = slot.job;
    if (!a.success || !job || a.data.id !== job.id) return;
    this.clearTimer(slot);
    slot.job = null;
    this.idle(slot);
    job.resolve(
      a.data.error
        ? { ok: false, reason: `math-verify error: ${a.data.error}` }
        : { ok: true, equal: a.data.equal },
    );
    this.pump();
  }

  private dispatch(slot: Slot, job: Job): void {
    slot.job = job;
    this.busy(slot);
    slot.timer = setTimeout(
      () => this.crash(slot, `math-verify timeout after ${job.timeoutMs} ms`),
      job.timeoutMs,
    );
    slot.child.stdin.write(`${JSON.stringify({ id: job.id, ...job.req })}\n`);
  }

  private startFailedOrCrash(slot: Slot, reason: string): void {
    if (slot.ready) this.crash(slot, reason);
    else this.startFailed(slot, reason);
  }

  /** A worker that never became ready: nothing will start, so fail everything and stop trying. */
  private startFailed(slot: Slot, reason: string): void {
    if (!this.slots.includes(slot)) return;
    this.broken ??= reason;
    for (const s of this.slots.splice(0)) {
      if (s.job) s.job.resolve({ ok: false, reason: `math-verify unavailable: ${reason}` });
      s.job = null;
      void this.kill(s);
    }
    for (const j of this.queue.splice(0))
      j.resolve({ ok: false, reason: `math-verify unavailable: ${reason}` });
  }

  /** A running worker that hung or died: its job fails, and a fresh worker starts when needed. */
  private crash(slot: Slot, reason: string): void {
    const i = this.slots.indexOf(slot);
    if (i < 0) return;
    this.slots.splice(i, 1);
    const job = slot.job;
    slot.job = null;
    void this.kill(slot);
    job?.resolve({ ok: false, reason });
    this.pump();
  }

  private kill(slot: Slot): Promise<void> {
    this.clearTimer(slot);
    const { child } = slot;
    child.removeAllListeners("exit");
    if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
    this.busy(slot); // an unref'd child's exit event would never come if nothing else keeps us alive
    return new Promise((resolve) => {
      child.once("exit", () => resolve());
      child.kill("SIGKILL");
    });
  }

  /** An idle worker must not keep the process alive; a busy one must. */
  private idle(slot: Slot): void {
    slot.child.unref();
    for (const s of [slot.child.stdin, slot.child.stdout, slot.child.stderr])
      (s as unknown as { unref(): void }).unref();
  }

  private busy(slot: Slot): void {
    slot.child.ref();
    for (const s of [slot.child.stdin, slot.child.stdout, slot.child.stderr])
      (s as unknown as { ref(): void }).ref();
  }

  private clearTimer(slot: Slot): void {
    if (slot.timer) clearTimeout(slot.timer);
    slot.timer = null;
  }
}

let shared: MathVerifyPool | null = null;

/** The process-wide Math-Verify pool (created on first use). */
export function sharedMathVerifyPool(): MathVerifyPool {
  shared ??= new MathVerifyPool();
  return shared;
}

/** Stops the shared pool's workers (CLI commands and tests call this before exiting). */
export async function closeSharedMathVerifyPool(): Promise<void> {
  const p = shared;
  shared = null;
  if (p) await p.close();
}
