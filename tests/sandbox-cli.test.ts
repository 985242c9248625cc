// `marft sandbox run` as a person runs it: the real CLI in a child process, JSON on stdout.
import { execFile, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), "marft-sbx-cli-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function marft(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return marftEnv({}, ...args);
}

async function marftEnv(
  env: Record<string, string>,
  ...args: string[]
): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run("node", ["bin/marft.mjs", ...args], {
      timeout: 30_000,
      env: { ...process.env, ...env },
    });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

describe("marft sandbox run", () => {
  it("prints one JSON result for a program that succeeds, with its stdin", async () => {
    const file = join(dir, "rev.py");
    writeFileSync(file, "import sys\nprint(sys.stdin.read()[::-1])\n");
    writeFileSync(join(dir, "in.txt"), "abc");
    const r = await marft(
      "sandbox",
      "run",
      "--lang",
      "python",
      "--timeout",
      "5",
      "--stdin",
      join(dir, "in.txt"),
      file,
    );
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout);
    expect(out).toMatchObject({ status: "ok", exit_code: 0, stdout: "cba\n", stderr: "", truncated: false });
    expect(typeof out.wall_ms).toBe("number");
  });

  it("reports a timeout for a program that loops", async () => {
    const file = join(dir, "loop.py");
    writeFileSync(file, "while True:\n    pass\n");
    const r = await marft("sandbox", "run", "--lang", "python", "--timeout", "1", file);
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout);
    expect(out.status).toBe("timeout");
    expect(out.exit_code).toBeNull();
    expect(out.wall_ms).toBeGreaterThanOrEqual(900);
  });

  it("rejects bad arguments with a message that names them", async () => {
    const bad = await marft("sandbox", "run", "--lang", "ruby", "--timeout", "1", join(dir, "x.rb"));
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--lang: only "python" is supported');
    const missing = await marft("sandbox", "run", "--timeout", "1", join(dir, "missing.py"));
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain("missing.py");
  });

  // The fallbacks, forced: each mode still runs programs, says how it was isolated and warns.
  const probe = `import os, socket, json
out = {"env": sorted(os.environ), "uid": os.getuid()}
s = socket.socket()
s.settimeout(1)
try:
    s.connect(("1.1.1.1", 53))
    out["net"] = "connected"
except OSError as e:
    out["net"] = e.errno
try:
    open("/etc/marft-escape-test", "w")
    out["etc"] = "wrote"
except OSError as e:
    out["etc"] = e.errno
print(json.dumps(out))
`;

  // Where the machine cannot make a user namespace at all, there is nothing to test.
  const userns = spawnSync("unshare", [
    "--user",
    "--map-root-user",
    "--net",
    "--mount",
    "--pid",
    "--fork",
    "true",
  ]);
  it.skipIf(userns.status !== 0)("userns mode: no network, read-only host, a warning", async () => {
    const file = join(dir, "probe.py");
    writeFileSync(file, probe);
    const r = await marftEnv({ MARFT_SANDBOX_ISOLATION: "userns" }, "sandbox", "run", "--timeout", "5", file);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout);
    expect(out.isolation).toBe("userns");
    expect(r.stderr).toContain('WARNING: running programs with isolation "userns"');
    const seen = JSON.parse(out.stdout);
    expect(seen.env).toEqual(["HOME", "LANG", "PATH", "PYTHONIOENCODING", "TMPDIR"]);
    expect(seen.net).toBe(101); // ENETUNREACH: an empty network namespace
    expect(seen.etc).toBe(30); // EROFS
  });

  it("none mode: rlimits, cleared environment and (as root) another uid remain", async () => {
    const file = join(dir, "probe.py");
    writeFileSync(file, probe);
    const r = await marftEnv({ MARFT_SANDBOX_ISOLATION: "none" }, "sandbox", "run", "--timeout", "5", file);
    expect(r.code).toBe(0);
    const out = JSON.parse(r.stdout);
    expect(out.isolation).toBe("none");
    expect(r.stderr).toContain('WARNING: running programs with isolation "none"');
    const seen = JSON.parse(out.stdout);
    expect(seen.env).toEqual(["HOME", "LANG", "PATH", "PYTHONIOENCODING", "TMPDIR"]);
    if (process.getuid?.() === 0) {
      expect(seen.uid).toBeGreaterThanOrEqual(200_000);
      expect(seen.etc).toBe(13); // EACCES: not root any more
    }
    // A daemon that escapes the process group and holds stdout open must not hang the caller.
    const daemon = join(dir, "daemon.py");
    writeFileSync(
      daemon,
      "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(20)\nprint('parent done')\n",
    );
    const t0 = Date.now();
    const d = await marftEnv({ MARFT_SANDBOX_ISOLATION: "none" }, "sandbox", "run", "--timeout", "3", daemon);
    expect(Date.now() - t0).toBeLessThan(14_000); // the daemon holds stdout for 20 s
    expect(JSON.parse(d.stdout)).toMatchObject({ status: "ok", stdout: "parent done\n" });
    const loop = join(dir, "loop2.py");
    writeFileSync(loop, "while True:\n    pass\n");
    const t = await marftEnv({ MARFT_SANDBOX_ISOLATION: "none" }, "sandbox", "run", "--timeout", "1", loop);
    expect(JSON.parse(t.stdout).status).toBe("timeout");
  });
});
