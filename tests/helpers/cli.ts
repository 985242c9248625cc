// Shared helpers for the tests that run the CLI as a user does, `node bin/marft.mjs ...` in a child
// process, and kill and resume it:
//
//   const child = marft(["train", config, "--quiet"]);
//   const done = finish(child);                        // its output and exit, collected from now
//   await when(child, () => latestIs(runDir, "iter_1"), "its first checkpoint");
//   child.kill("SIGKILL");
//   expect((await done).signal).toBe("SIGKILL");
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { TEST_ENGINE_ENV } from "./engine.ts";

const ROOT = join(import.meta.dirname, "..", "..");

/** `marft ARGS` from the checkout's root, its engine kept to one CPU thread, `env` added. */
export function marft(args: string[], env: Record<string, string> = {}): ChildProcess {
  return spawn(process.execPath, [join(ROOT, "bin", "marft.mjs"), ...args], {
    cwd: ROOT,
    env: { ...process.env, ...TEST_ENGINE_ENV, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
}

/** The child's exit, with its stdout and stderr together (call it before the child can write). */
export function finish(
  child: ChildProcess,
): Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }> {
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  return new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal, out })));
}

/** Resolves when `cond()` holds (polling), rejects if the child exits first. */
export function when(child: ChildProcess, cond: () => boolean, what: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const t = setInterval(() => {
      if (cond()) {
        clearInterval(t);
        resolve();
      } else if (child.exitCode !== null || child.signalCode !== null) {
        clearInterval(t);
        reject(new Error(`the run ended before ${what}`));
      }
    }, 20);
  });
}

/** Whether the run directory's latest checkpoint is `name` (e.g. "iter_2"). */
export function latestIs(dir: string, name: string): boolean {
  const latest = join(dir, "checkpoints", "latest");
  return existsSync(latest) && readFileSync(latest, "utf8").trim() === name;
}

/** metrics.jsonl rows without what differs from run to run (time/*, throughput/*). */
export const comparable = (rows: Array<Record<string, unknown>>): Array<Record<string, unknown>> =>
  rows.map((r) =>
    Object.fromEntries(
      Object.entries(r).filter(([k]) => !k.startsWith("time/") && !k.startsWith("throughput/")),
    ),
  );
