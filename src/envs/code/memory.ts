// The memory limit of a sandboxed program covers the program and all its children together.
//
// RLIMIT_AS alone is per process: 8 children under `--memory 256` used 1.6 GiB. Two ways, the
// strongest this machine allows (MARFT_SANDBOX_MEMORY=cgroup|accounting forces one):
// - "cgroup": a memory cgroup per run (cgroup v2 memory.max, or v1 memory.limit_in_bytes, swap
//   included where the kernel accounts it), made beside the cgroup this process is in. The wrapper
//   moves itself into it before it forks the program, so every process of the run is charged
//   (tmpfs pages the program writes too); the kernel's OOM killer acts at the limit, and the
//   cgroup's oom_kill count and peak usage come back in the result.
// - "accounting": the wrapper sums the proportional set size (Pss) of every process of the run
//   every 10 ms and kills them all when the sum passes the limit; RLIMIT_AS (per process) and
//   RLIMIT_NPROC (the process cap) stay. The bound then holds up to what the program allocates in
//   one 10 ms interval.
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

export type MemoryMode = "cgroup" | "accounting";

export interface MemoryCgroup {
  /** The run's cgroup directory; the wrapper writes its own pid into `cgroup.procs` there. */
  dir: string;
  version: 1 | 2;
}

/** Where run cgroups go: beside this process's own memory cgroup, if the machine lets us make one. */
interface CgroupBase {
  dir: string;
  version: 1 | 2;
}

let base: CgroupBase | null | undefined;
let serial = 0;

/** The mode for the next run: forced by MARFT_SANDBOX_MEMORY, else cgroup where possible. */
export function memoryMode(): { mode: MemoryMode; why: string } {
  const forced = process.env["MARFT_SANDBOX_MEMORY"];
  if (forced !== undefined && forced !== "cgroup" && forced !== "accounting")
    throw new Error(`MARFT_SANDBOX_MEMORY: expected cgroup or accounting, got "${forced}"`);
  base ??= findCgroupBase();
  if (forced === "accounting") return { mode: "accounting", why: "MARFT_SANDBOX_MEMORY=accounting" };
  if (base) return { mode: "cgroup", why: `cgroup v${base.version} under ${base.dir}` };
  if (forced === "cgroup") throw new Error("MARFT_SANDBOX_MEMORY=cgroup: no memory cgroup can be made here");
  return {
    mode: "accounting",
    why: "no memory cgroup can be made here (needs root and a writable cgroupfs)",
  };
}

function findCgroupBase(): CgroupBase | null {
  let own: string;
  try {
    own = readFileSync("/proc/self/cgroup", "utf8");
  } catch {
    return null; // not Linux
  }
  const candidates: CgroupBase[] = [];
  for (const line of own.split("\n")) {
    const [, controllers, path] = line.split(":");
    if (path === undefined) continue;
    if (controllers === "" && existsSync("/sys/fs/cgroup/cgroup.controllers"))
      candidates.push({ dir: join("/sys/fs/cgroup", path), version: 2 });
    if (controllers?.split(",").includes("memory"))
      candidates.push({ dir: join("/sys/fs/cgroup/memory", path), version: 1 });
  }
  for (const c of candidates) {
    const probe = join(c.dir, `marft-probe-${process.pid}`);
    try {
      mkdirSync(probe);
      const ok = existsSync(join(probe, c.version === 2 ? "memory.max" : "memory.limit_in_bytes"));
      rmdirSync(probe);
      if (ok) return c;
    } catch {}
  }
  return null;
}

/** A cgroup for one run, limited to `memoryMb` (swap included where it is accounted). */
export function makeRunCgroup(memoryMb: number): MemoryCgroup {
  if (!base) throw new Error("makeRunCgroup: no cgroup base (memoryMode() says accounting)");
  const dir = join(base.dir, `marft-sbx-${process.pid}-${serial++}`);
  mkdirSync(dir);
  const bytes = String(memoryMb * 1024 * 1024);
  if (base.version === 2) {
    writeFileSync(join(dir, "memory.max"), bytes);
    if (existsSync(join(dir, "memory.swap.max"))) writeFileSync(join(dir, "memory.swap.max"), "0");
  } else {
    writeFileSync(join(dir, "memory.limit_in_bytes"), bytes);
    // memory + swap: may not be below the memory limit, so it is set after it
    if (existsSync(join(dir, "memory.memsw.limit_in_bytes")))
      writeFileSync(join(dir, "memory.memsw.limit_in_bytes"), bytes);
  }
  return { dir, version: base.version };
}

/** What the run's cgroup saw (read after the run), then the cgroup removed. */
export async function closeRunCgroup(cg: MemoryCgroup): Promise<{ oomKills: number; peakBytes: number }> {
  const read = (f: string) => {
    try {
      return readFileSync(join(cg.dir, f), "utf8");
    } catch {
      return "";
    }
  };
  const counter = (text: string, key: string) =>
    Number(new RegExp(`^${key} (\\d+)$`, "m").exec(text)?.[1] ?? 0);
  const oomKills = counter(read(cg.version === 2 ? "memory.events" : "memory.oom_control"), "oom_kill");
  const peakBytes = Number(read(cg.version === 2 ? "memory.peak" : "memory.max_usage_in_bytes").trim()) || 0;
  // The pid namespace is gone when the wrapper exits, but its processes may still be being reaped.
  for (let i = 0; i < 50; i++) {
    try {
      rmdirSync(cg.dir);
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") break;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  return { oomKills, peakBytes };
}
