// Starting and stopping a local engine process, or connecting to a remote one (DESIGN §2).
//
// A local engine listens on loopback on a port the OS picks, with a random bearer token, and prints
// one JSON line `{"event": "ready", "url": ...}` on stdout when it listens. Its stderr (the log) goes
// to `logFile`. It is stopped when this process exits (normally, by SIGINT/SIGTERM with no other
// handler installed, or by an uncaught exception); `--parent-pid` makes the engine exit by itself if
// this process dies without running its exit hooks (SIGKILL).
//
// The engine runs in its own process group, so a Ctrl-C in the terminal reaches only this process:
// the trainer can still save a checkpoint through the engine before exiting.
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import type { Socket } from "node:net";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { EngineClient } from "./client.ts";

export interface Engine {
  client: EngineClient;
  url: string;
  token: string;
  /** Stops a local engine (SIGTERM, then SIGKILL after a grace period); a no-op for a remote one. */
  stop(): Promise<void>;
  /** The engine process; null for a remote engine. */
  process: ChildProcess | null;
}

export interface LocalEngineOptions {
  device?: "auto" | "cpu" | "cuda";
  /** Where the engine's log (stderr) is appended. */
  logFile: string;
  /** Working directory of the engine (default: the repository root). */
  cwd?: string;
  /** Extra environment variables for the engine (e.g. OMP_NUM_THREADS). */
  env?: Record<string, string>;
  /** Python interpreter (default: $MARFT_PYTHON or <repo>/.venv/bin/python). */
  python?: string;
  /** Most rows in one decode batch (the engine's --max-batch). */
  maxBatch?: number;
  /** Engine replicas on Ray (more than 1, or with `ray`, the engine's --replicas and its flags). */
  replicas?: ReplicaOptions;
  /** How long to wait for the ready line and health (default 180 s: first imports are slow; with
   * replicas 600 s: a Ray cluster starts, then every replica imports torch and builds its engine). */
  startTimeoutMs?: number;
  /** The returned client's stall limit (EngineClientOptions.stallMs). */
  stallMs?: number;
  /** Every checkpoint path must lie in this directory (the engine's --checkpoint-root; default: the
   * parent of the directory holding `logFile`, i.e. the runs folder of a run's engine.log). */
  checkpointRoot?: string;
}

/** Engine replicas (`engine.replicas`, `engine.ray`, `engine.replica` of the run config). */
export interface ReplicaOptions {
  count: number;
  /** An existing Ray cluster; omitted: the engine starts a local one. */
  rayAddress?: string;
  cpus?: number;
  gpus?: number;
  threads?: number;
}

/** The engine's flags for `replicas`: none for one engine without a Ray address (one process). */
export function replicaArgs(r: ReplicaOptions | undefined): string[] {
  if (!r || (r.count <= 1 && r.rayAddress === undefined)) return [];
  const args = ["--replicas", String(r.count)];
  if (r.rayAddress !== undefined) args.push("--ray-address", r.rayAddress);
  if (r.cpus !== undefined) args.push("--replica-cpus", String(r.cpus));
  if (r.gpus !== undefined) args.push("--replica-gpus", String(r.gpus));
  if (r.threads !== undefined) args.push("--replica-threads", String(r.threads));
  return args;
}

export interface RemoteEngineOptions {
  url: string;
  token: string;
  stallMs?: number;
}

const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
/** Where a local engine runs (its relative paths, e.g. of `hf:` sources, are taken from here). */
export const ENGINE_CWD = REPO_ROOT;

/**
 * Environment that preloads tcmalloc into an engine process, where `make setup` unpacked it into the
 * model cache (`MARFT_CACHE_DIR`, default `.cache`): the engine's CPU passes ran faster with it than
 * with glibc's malloc, which also maps a shared training pass's large tensors fresh each call
 * (docs/MEASUREMENTS.md). Empty where it is missing or `MARFT_ALLOCATOR=system` asks for glibc's.
 */
export function engineAllocatorEnv(env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  if (env["MARFT_ALLOCATOR"] === "system") return {};
  const cache = env["MARFT_CACHE_DIR"] ?? resolve(REPO_ROOT, ".cache");
  const lib = resolve(cache, "tcmalloc", "libtcmalloc_minimal.so.4");
  if (!existsSync(lib)) return {};
  return {
    LD_PRELOAD: [lib, env["LD_PRELOAD"]].filter(Boolean).join(":"),
    // tcmalloc reports each allocation over 1 GB on stderr (the engine log) unless told otherwise
    TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD: String(2 ** 40),
  };
}

/** The last `lines` lines of a log file, for error messages. */
export function logTail(file: string, lines = 30): string {
  if (!existsSync(file)) return "(no log)";
  const text = readFileSync(file, "utf8").trimEnd();
  return text.split("\n").slice(-lines).join("\n") || "(empty log)";
}

// ---------------------------------------------------------------------------------------------------
// Process hooks: one set for all live engines, so starting many engines adds no listeners per engine.

const live = new Set<ChildProcess>();
let hooked = false;

function killAllNow(): void {
  for (const child of live) {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
  }
  live.clear();
}

function onSignal(signal: NodeJS.Signals): void {
  // If the program has its own handler (e.g. the trainer saves a checkpoint on Ctrl-C), it decides
  // when to exit and the 'exit' hook stops the engines then. Otherwise keep Node's default: stop the
  // engines and die of the same signal.
  if (process.listenerCount(signal) > 1) return;
  killAllNow();
  unhook();
  process.kill(process.pid, signal);
}

const onSigint = () => onSignal("SIGINT");
const onSigterm = () => onSignal("SIGTERM");

function hook(): void {
  if (hooked) return;
  hooked = true;
  process.on("exit", killAllNow);
  process.on("SIGINT", onSigint);
  process.on("SIGTERM", onSigterm);
  // The monitor variant observes an uncaught exception without changing how Node handles it.
  process.on("uncaughtExceptionMonitor", killAllNow);
}

function unhook(): void {
  if (!hooked) return;
  hooked = false;
  process.off("exit", killAllNow);
  process.off("SIGINT", onSigint);
  process.off("SIGTERM", onSigterm);
  process.off("uncaughtExceptionMonitor", killAllNow);
}

// ---------------------------------------------------------------------------------------------------

/** Connects to an engine that runs elsewhere (e.g. a GPU server); checks its health. */
export async function connectEngine(opts: RemoteEngineOptions): Promise<Engine> {
  const client = new EngineClient({ url: opts.url, token: opts.token, stallMs: opts.stallMs });
  await client.health({ timeoutMs: 30_000 });
  return { client, url: client.url, token: opts.token, stop: async () => {}, process: null };
}

/** Spawns `python -m marft_engine.server` on loopback, waits until it is healthy. */
export async function startLocalEngine(opts: LocalEngineOptions): Promise<Engine> {
  const python = opts.python ?? process.env["MARFT_PYTHON"] ?? resolve(REPO_ROOT, ".venv", "bin", "python");
  if (!existsSync(python)) {
    throw new Error(
      `engine: python interpreter ${python} not found (run \`make setup\` in a checkout or \`npx marft setup\` where marft is installed, or set MARFT_PYTHON)`,
    );
  }
  const token = randomBytes(24).toString("base64url");
  const startTimeoutMs = opts.startTimeoutMs ?? (replicaArgs(opts.replicas).length ? 600_000 : 180_000);
  mkdirSync(dirname(resolve(opts.logFile)), { recursive: true });
  const logFd = openSync(opts.logFile, "a");
  const args = ["-m", "marft_engine.server", "--host", "127.0.0.1", "--port", "0"];
  args.push("--parent-pid", String(process.pid), "--device", opts.device ?? "auto");
  if (opts.maxBatch !== undefined) args.push("--max-batch", String(opts.maxBatch));
  // a run directory's engine.log lies in the run directory: its parent holds the run's checkpoints
  const root = opts.checkpointRoot ?? dirname(dirname(resolve(opts.logFile)));
  args.push("--checkpoint-root", resolve(root));
  args.push(...replicaArgs(opts.replicas));
  let child: ChildProcess;
  try {
    child = spawn(python, args, {
      cwd: opts.cwd ?? REPO_ROOT,
      env: {
        ...process.env,
        PYTHONUNBUFFERED: "1",
        ...opts.env,
        // after opts.env: its own LD_PRELOAD is kept inside this one, not put in its place
        ...engineAllocatorEnv({ ...process.env, ...opts.env }),
        MARFT_ENGINE_TOKEN: token,
      },
      stdio: ["ignore", "pipe", logFd],
      detached: true,
    });
  } finally {
    closeSync(logFd); // the child holds its own copy of the descriptor
  }
  live.add(child);
  hook();

  const exited = new Promise<void>((resolveExit) => {
    if (child.exitCode !== null || child.signalCode !== null) resolveExit();
    else child.once("exit", () => resolveExit());
  });
  child.once("exit", () => {
    live.delete(child);
    if (live.size === 0) unhook();
  });

  const fail = async (why: string): Promise<never> => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
    throw new Error(`engine: ${why}\n--- last lines of ${opts.logFile} ---\n${logTail(opts.logFile)}`);
  };

  // Wait for the ready line; any other stdout line is kept for the error message.
  const url = await new Promise<string | Error>((resolveUrl) => {
    const lines = createInterface({ input: child.stdout! });
    const timer = setTimeout(
      () => resolveUrl(new Error(`did not print its ready line within ${startTimeoutMs} ms`)),
      startTimeoutMs,
    );
    lines.on("line", (line) => {
      try {
        const msg = JSON.parse(line) as { event?: unknown; url?: unknown };
        if (msg.event === "ready" && typeof msg.url === "string") {
          clearTimeout(timer);
          resolveUrl(msg.url);
        }
      } catch {
        // not JSON: an ordinary print; the log file has stderr, stdout lines are not needed.
      }
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      resolveUrl(
        new Error(`exited before it was ready (${signal ? `signal ${signal}` : `exit code ${code}`})`),
      );
    });
    child.once("error", (e) => {
      clearTimeout(timer);
      resolveUrl(new Error(`could not start ${python}: ${e.message}`));
    });
  });
  if (url instanceof Error) return fail(url.message);

  const client = new EngineClient({ url, token, stallMs: opts.stallMs });
  try {
    await client.health({ timeoutMs: Math.min(startTimeoutMs, 30_000) });
  } catch (e) {
    return fail(`printed ready at ${url} but /v1/health failed: ${(e as Error).message}`);
  }
  // Forgetting stop() must not keep this process alive: the exit hook stops the engine.
  // (stdout stays open and drained: closing it would make a later print fail in the engine.)
  child.unref();
  (child.stdout as Socket | null)?.unref();

  const stop = async (graceMs = 10_000): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    // Waiting for the exit must keep this process alive: an unref'd child's exit does not, and Node
    // would leave with code 13 (an unsettled await) before the caller can print why it stopped.
    child.ref();
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    // The child is unref'd: once the SIGKILL timer has fired, nothing else may keep the event loop
    // alive until its exit is seen, and Node would quit mid-await (exit code 13, "unsettled
    // top-level await"). Seen on loaded machines where an engine takes over 10 s to stop.
    const alive = setInterval(() => {}, 1000);
    await exited;
    clearTimeout(timer);
    clearInterval(alive);
  };
  return { client, url, token, stop, process: child };
}
