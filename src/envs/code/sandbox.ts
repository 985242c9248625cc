// Running untrusted generated programs (DESIGN §7).
//
// Each program runs in its own child process tree, built by sandbox_wrapper.py:
//   unshare --net --pid --fork --kill-child --mount --ipc --uts   (isolation "root")
//     python3 -I -S sandbox_wrapper.py CONFIG                     (pid 1 of the new pid namespace)
//       └─ python3 -I -S -B main.py                               (the program)
// What is enforced, in the "root" mode (we run as root, as in CI):
// - no network: a fresh network namespace with only a loopback device that is down, so neither
//   127.0.0.1 (the host's loopback is another namespace) nor any outside address is reachable;
// - no writes outside the sandbox: every mount is read-only in a private mount namespace; /tmp,
//   /var/tmp, /run and /dev/shm are empty read-only tmpfs (so host unix sockets there, which a
//   network namespace does not cover, are out of reach); the only writable place is a size-capped
//   tmpfs over the work dir, which vanishes with the namespace;
// - an unprivileged uid of its own (no supplementary groups, no_new_privs), so RLIMIT_NPROC caps
//   this program's processes without touching other sandboxes, and file permissions apply;
// - a fresh pid namespace and /proc: the program sees only its own processes, and when it exits (or
//   is killed) the kernel kills everything it left behind (fork bombs);
// - RLIMIT_CPU (timeout), RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE, no core;
// - the memory limit for the program and its children together: a memory cgroup per run, or where
//   none can be made, the wrapper's accounting of their Pss (memory.ts);
// - a cleared environment (PATH=/usr/bin:/bin, HOME=TMPDIR=work dir) and python's isolated mode;
// - a wall-clock timeout that SIGKILLs the whole process group (unshare's --kill-child takes the
//   namespace down with it), and stdout/stderr capped (truncated, killed, and said so).
// Where unshare is not allowed as root, a user namespace is tried ("userns": the same, except the
// program keeps the caller's uid, so RLIMIT_NPROC counts the caller's processes too); where no
// namespace can be made ("none"), only the rlimits, the cleared environment, the uid change (if
// root) and the process-group timeout remain, and a warning says so once.
// MARFT_SANDBOX_ISOLATION=root|userns|none forces one mode (to test the fallbacks, or to opt out).
//
// Everything here is asynchronous: a rollout's event loop never waits on a program.
import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants, existsSync, realpathSync } from "node:fs";
import { chown, mkdtemp, rm, writeFile } from "node:fs/promises";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { closeRunCgroup, type MemoryCgroup, type MemoryMode, makeRunCgroup, memoryMode } from "./memory.ts";

export type SandboxStatus = "ok" | "error" | "timeout" | "memory" | "output_limit" | "killed";
export type IsolationMode = "root" | "userns" | "none";

export interface SandboxOptions {
  lang: "python";
  code: string;
  stdin?: string;
  /** Wall-clock limit; the CPU-time limit is the same number of seconds, rounded up. */
  timeoutMs: number;
  /** Memory of the program and all its children together (and RLIMIT_AS of each process). */
  memoryMb: number;
  /** Cap per stream (stdout, stderr); past it the program is killed. Default 64 KiB. */
  maxOutputBytes?: number;
  /** Largest file the program may write (RLIMIT_FSIZE). Default 16 MiB. */
  fileMb?: number;
  /** Size of the private tmpfs work dir, in the modes that have one. Default 64 MiB. */
  diskMb?: number;
  /** Processes (and threads) the program may run at once (RLIMIT_NPROC). Default 32. */
  maxProcs?: number;
  /** Aborting kills the program; the result then has status "killed". */
  signal?: AbortSignal;
}

export interface SandboxResult {
  status: SandboxStatus;
  /** null when the program was killed by a signal. */
  exitCode: number | null;
  /** The signal that ended the program, e.g. "SIGKILL", or null. */
  signal: string | null;
  stdout: string;
  stderr: string;
  wallMs: number;
  /** True when stdout or stderr was cut at maxOutputBytes (the text also says so at its end). */
  truncated: boolean;
  isolation: IsolationMode;
  /** How the memory limit was enforced: a cgroup, or the wrapper's accounting (memory.ts). */
  memoryMode: MemoryMode;
  /** Peak memory of the program and its children together (cgroup: charged; accounting: Pss). */
  memoryPeakBytes: number;
}

/** The sandbox itself could not be built: an infrastructure failure, never the program's fault. */
export class SandboxSetupError extends Error {
  override name = "SandboxSetupError";
}

export interface Isolation {
  mode: IsolationMode;
  /** The interpreter that runs both the wrapper and the programs. */
  python: string;
  /** Why a stronger mode was not used (empty in the "root" mode). */
  notes: string[];
}

const WRAPPER = fileURLToPath(new URL("./sandbox_wrapper.py", import.meta.url));
const UNSHARE_ROOT = ["--net", "--pid", "--fork", "--kill-child", "--mount", "--ipc", "--uts"];
const UNSHARE_USER = [
  "--user",
  "--map-root-user",
  "--net",
  "--pid",
  "--fork",
  "--kill-child",
  "--mount",
  "--ipc",
];
const MEMORY_PATTERN = /MemoryError|Cannot allocate memory|out of memory|std::bad_alloc/;
const SIGNALS: Record<number, string> = {
  6: "SIGABRT",
  9: "SIGKILL",
  11: "SIGSEGV",
  15: "SIGTERM",
  24: "SIGXCPU",
  25: "SIGXFSZ",
};

/**
 * The interpreter for sandboxed programs: $MARFT_SANDBOX_PYTHON, else a system python3 that an
 * unprivileged uid can execute (a pyenv shim under /root is neither a binary nor readable by it).
 */
export function findPython(): string {
  const fromEnv = process.env["MARFT_SANDBOX_PYTHON"];
  if (fromEnv) return fromEnv;
  for (const p of ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"]) {
    try {
      accessSync(p, constants.X_OK);
      return realpathSync(p);
    } catch {}
  }
  for (const dir of (process.env["PATH"] ?? "").split(":")) {
    const p = join(dir, "python3");
    if (dir && existsSync(p)) return p;
  }
  throw new SandboxSetupError("no python3 found: set MARFT_SANDBOX_PYTHON to a python3 binary");
}

let isolationPromise: Promise<Isolation> | undefined;

/**
 * Finds, once per process, the strongest isolation this machine allows, by running a real program
 * through each mode in turn. Warns on stderr when it has to settle for less than "root".
 */
export function detectIsolation(): Promise<Isolation> {
  isolationPromise ??= (async () => {
    const python = findPython();
    const notes: string[] = [];
    const forced = process.env["MARFT_SANDBOX_ISOLATION"];
    if (forced !== undefined && !["root", "userns", "none"].includes(forced)) {
      throw new SandboxSetupError(`MARFT_SANDBOX_ISOLATION: expected root, userns or none, got "${forced}"`);
    }
    const modes: IsolationMode[] = forced
      ? [forced as IsolationMode]
      : process.getuid?.() === 0
        ? ["root", "userns", "none"]
        : ["userns", "none"];
    if (forced) notes.push(`MARFT_SANDBOX_ISOLATION=${forced}`);
    if (process.platform !== "linux") notes.push(`namespaces need Linux (this is ${process.platform})`);
    for (const mode of modes) {
      if (mode !== "none" && process.platform !== "linux") continue;
      try {
        const r = await runIn({ mode, python, notes }, PROBE);
        if (r.status === "ok" && r.stdout === "sandbox ok\n") {
          if (mode !== "root") {
            process.stderr.write(
              `marft sandbox: WARNING: running programs with isolation "${mode}" (weaker than "root"): ${notes.join("; ")}\n`,
            );
          }
          return { mode, python, notes };
        }
        notes.push(`mode "${mode}" failed: status ${r.status}: ${r.stderr.trim().slice(0, 300)}`);
      } catch (e) {
        notes.push(`mode "${mode}" failed: ${(e as Error).message}`);
      }
    }
    throw new SandboxSetupError(`cannot run sandboxed programs at all: ${notes.join("; ")}`);
  })();
  return isolationPromise;
}

const PROBE: SandboxOptions = {
  lang: "python",
  code: "print('sandbox ok')",
  timeoutMs: 10_000,
  memoryMb: 256,
};

/** Runs one program in the sandbox. Rejects only with SandboxSetupError; every program outcome is a status. */
export async function runSandboxed(opts: SandboxOptions): Promise<SandboxResult> {
  return runIn(await detectIsolation(), opts);
}

// uids handed to running programs (root mode), so two sandboxes never share an RLIMIT_NPROC count.
const uidsInUse = new Set<number>();
function takeUid(): number {
  for (;;) {
    const uid = 200_000 + Math.floor(Math.random() * 800_000);
    if (!uidsInUse.has(uid)) {
      uidsInUse.add(uid);
      return uid;
    }
  }
}

async function runIn(iso: Isolation, opts: SandboxOptions): Promise<SandboxResult> {
  if (opts.lang !== "python")
    throw new Error(`sandbox: unsupported lang "${String(opts.lang)}" (only "python")`);
  if (!(opts.timeoutMs > 0)) throw new Error(`sandbox: timeoutMs must be > 0, got ${opts.timeoutMs}`);
  if (!(opts.memoryMb >= 32)) throw new Error(`sandbox: memoryMb must be >= 32, got ${opts.memoryMb}`);
  const maxOutput = opts.maxOutputBytes ?? 64 * 1024;
  // A uid of its own needs root outside a user namespace (inside one, only uid 0 is mapped).
  const uid = process.getuid?.() === 0 && iso.mode !== "userns" ? takeUid() : null;
  const workdir = await mkdtemp(join(tmpdir(), "marft-sbx-"));
  const memory = memoryMode().mode;
  let cgroup: MemoryCgroup | undefined;
  try {
    if (memory === "cgroup") cgroup = makeRunCgroup(opts.memoryMb);
    await writeFile(join(workdir, "main.py"), opts.code);
    // Without a private tmpfs the program writes into the work dir itself, as its own uid.
    if (iso.mode === "none" && uid !== null) await chown(workdir, uid, uid);
    const config = JSON.stringify({
      workdir,
      python: iso.python,
      timeout_s: opts.timeoutMs / 1000,
      memory_mb: opts.memoryMb,
      file_mb: opts.fileMb ?? 16,
      disk_mb: opts.diskMb ?? 64,
      nproc: opts.maxProcs ?? 32,
      uid,
      isolate_fs: iso.mode !== "none",
      userns: iso.mode === "userns",
      memory_mode: memory,
      cgroup_dir: cgroup?.dir ?? null,
    });
    const wrapper = [iso.python, "-I", "-S", WRAPPER, config];
    const [cmd, ...args] =
      iso.mode === "root"
        ? ["unshare", ...UNSHARE_ROOT, ...wrapper]
        : iso.mode === "userns"
          ? ["unshare", ...UNSHARE_USER, ...wrapper]
          : wrapper;
    const r = await execute(cmd!, args, opts, maxOutput, iso.mode);
    if (!cgroup || r.memoryMode !== "cgroup") return r;
    const seen = await closeRunCgroup(cgroup);
    cgroup = undefined;
    const status = seen.oomKills > 0 && r.status !== "ok" && r.status !== "timeout" ? "memory" : r.status;
    return { ...r, status, memoryPeakBytes: seen.peakBytes };
  } finally {
    if (cgroup) await closeRunCgroup(cgroup);
    if (uid !== null) uidsInUse.delete(uid);
    await rm(workdir, { recursive: true, force: true });
  }
}

interface Report {
  exit?: number | null;
  signal?: number | null;
  cpu_s?: number;
  maxrss_kb?: number;
  memory_mode?: MemoryMode;
  memory_exceeded?: boolean;
  peak_kb?: number;
  setup_error?: string;
}

function execute(
  cmd: string,
  args: string[],
  opts: SandboxOptions,
  maxOutput: number,
  mode: IsolationMode,
): Promise<SandboxResult> {
  return new Promise((resolve, reject) => {
    const start = performance.now();
    // detached: the child leads a new process group, so one kill reaches everything it started.
    const child: ChildProcess = spawn(cmd, args, {
      cwd: "/",
      env: { PATH: "/usr/bin:/bin:/usr/sbin:/sbin" },
      detached: true,
      stdio: ["pipe", "pipe", "pipe", "pipe"],
    });
    let timedOut = false;
    let overflowed = false;
    let aborted = false;
    const out = { stdout: new Capture(maxOutput), stderr: new Capture(maxOutput) };
    const reportChunks: Buffer[] = [];
    const kill = () => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, "SIGKILL");
      } catch {} // already gone
    };
    const timer = setTimeout(() => {
      timedOut = true;
      kill();
    }, opts.timeoutMs);
    const onAbort = () => {
      aborted = true;
      kill();
    };
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    if (opts.signal?.aborted) onAbort();

    const onData = (c: Capture) => (chunk: Buffer) => {
      if (!c.add(chunk) && !overflowed) {
        overflowed = true;
        kill();
      }
    };
    child.stdout!.on("data", onData(out.stdout));
    child.stderr!.on("data", onData(out.stderr));
    (child.stdio[3] as NodeJS.ReadableStream).on("data", (chunk: Buffer) => reportChunks.push(chunk));
    // The program may exit without reading its stdin: that EPIPE is not our error.
    child.stdin!.on("error", () => {});
    child.stdin!.end(opts.stdin ?? "");

    child.on("error", (e) => {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
      reject(new SandboxSetupError(`cannot start ${cmd}: ${e.message}`));
    });
    // Without a pid namespace ("none"), a daemon the program left behind can hold the pipes open
    // forever: once the wrapper has exited, give the pipes a moment, then stop waiting for them.
    let drain: NodeJS.Timeout | undefined;
    child.on("exit", () => {
      drain = setTimeout(() => {
        for (const s of [child.stdout, child.stderr, child.stdio[3]]) s?.destroy();
      }, 1000);
    });
    child.on("close", (code, sig) => {
      clearTimeout(timer);
      clearTimeout(drain);
      opts.signal?.removeEventListener("abort", onAbort);
      const wallMs = Math.round(performance.now() - start);
      const reports = parseReports(Buffer.concat(reportChunks).toString("utf8"));
      const setupError = reports.find((r) => r.setup_error !== undefined);
      if (setupError) {
        reject(new SandboxSetupError(`sandbox setup failed (${mode}): ${setupError.setup_error}`));
        return;
      }
      const report = reports[0];
      const stderr = out.stderr.text();
      const cpuLimit = Math.max(1, Math.ceil(opts.timeoutMs / 1000));
      let status: SandboxStatus;
      let exitCode: number | null = report?.exit ?? null;
      let signal: string | null =
        report?.signal != null ? (SIGNALS[report.signal] ?? `signal ${report.signal}`) : null;
      if (!report) {
        // The wrapper itself was killed (by us, or from outside): the program died with it.
        exitCode = null;
        signal = sig ?? (code !== null ? null : "SIGKILL");
        if (code !== null && code !== 0 && !timedOut && !overflowed && !aborted) {
          reject(new SandboxSetupError(`sandbox wrapper exited with ${code}: ${stderr.slice(0, 500)}`));
          return;
        }
      }
      if (overflowed || report?.signal === 25) status = "output_limit";
      else if (timedOut || report?.signal === 24 || (report?.signal === 9 && (report.cpu_s ?? 0) >= cpuLimit))
        status = "timeout";
      else if (aborted) status = "killed";
      else if (report?.memory_exceeded) status = "memory";
      else if (report?.exit === 0) status = "ok";
      else if (
        MEMORY_PATTERN.test(stderr) ||
        (report?.signal != null && (report.maxrss_kb ?? 0) * 1024 >= 0.9 * opts.memoryMb * 1024 * 1024)
      )
        status = "memory";
      else if (!report || report.signal != null) status = "killed";
      else status = "error";
      resolve({
        status,
        exitCode,
        signal,
        stdout: out.stdout.text(),
        stderr,
        wallMs,
        truncated: out.stdout.truncated || out.stderr.truncated,
        isolation: mode,
        memoryMode: report?.memory_mode ?? "accounting",
        memoryPeakBytes: (report?.peak_kb ?? 0) * 1024,
      });
    });
  });
}

/** The wrapper's JSON lines on fd 3; a line that does not parse is skipped (never thrown in a callback). */
function parseReports(text: string): Report[] {
  const out: Report[] = [];
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    try {
      out.push(JSON.parse(line) as Report);
    } catch {}
  }
  return out;
}

/** Keeps the first `max` bytes of a stream; add() returns false once the stream overflowed. */
class Capture {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  constructor(private readonly max: number) {}
  add(chunk: Buffer): boolean {
    if (this.truncated) return false;
    const room = this.max - this.size;
    if (chunk.length > room) {
      this.chunks.push(chunk.subarray(0, room));
      this.size = this.max;
      this.truncated = true;
      return false;
    }
    this.chunks.push(chunk);
    this.size += chunk.length;
    return true;
  }
  text(): string {
    const s = Buffer.concat(this.chunks).toString("utf8");
    return this.truncated ? `${s}\n[output truncated: more than ${this.max} bytes]` : s;
  }
}

/**
 * Runs many programs in parallel, at most `concurrency` at once (default: the number of cores);
 * the rest wait in FIFO order. `close()` kills what runs and refuses new work.
 */
export class SandboxPool {
  readonly concurrency: number;
  private running = 0;
  private waiting: Array<() => void> = [];
  private closed = false;
  private readonly abort = new AbortController();
  /** Programs finished since the pool was made. */
  completed = 0;

  constructor(opts: { concurrency?: number } = {}) {
    this.concurrency = opts.concurrency ?? availableParallelism();
    if (!Number.isInteger(this.concurrency) || this.concurrency < 1) {
      throw new Error(`SandboxPool: concurrency must be a positive integer, got ${opts.concurrency}`);
    }
  }

  get active(): number {
    return this.running;
  }

  get queued(): number {
    return this.waiting.length;
  }

  async run(opts: SandboxOptions): Promise<SandboxResult> {
    if (this.closed) throw new Error("SandboxPool: closed");
    if (this.running >= this.concurrency) await new Promise<void>((r) => this.waiting.push(r));
    if (this.closed) throw new Error("SandboxPool: closed");
    this.running++;
    try {
      const signal = opts.signal ? AbortSignal.any([opts.signal, this.abort.signal]) : this.abort.signal;
      return await runSandboxed({ ...opts, signal });
    } finally {
      this.running--;
      this.completed++;
      this.waiting.shift()?.();
    }
  }

  /** Kills running programs (status "killed") and rejects queued ones. */
  close(): void {
    this.closed = true;
    this.abort.abort();
    for (const wake of this.waiting.splice(0)) wake();
  }
}
