// `marft sandbox run` as a person runs it: the real CLI in a child process, JSON on stdout.
import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), "marft-sbx-cli-"));

async function marft(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run("node", ["bin/marft.mjs", ...args], { timeout: 30_000 });
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
});
