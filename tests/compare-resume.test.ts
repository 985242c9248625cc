// A killed `marft compare` resumes without recomputing finished cells: the job is killed with
// SIGKILL while its second cell trains (after that cell's first checkpoint); rerunning the same
// command reads the first cell back untouched, resumes the second from its checkpoint, and writes
// the complete comparison.
import { existsSync, mkdtempSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readCompare } from "../src/dashboard/files.ts";
import { finish, marft, when } from "./helpers/cli.ts";

const ROOT = join(import.meta.dirname, "..");

describe("marft compare is resumable", () => {
  it("killed mid-job, rerun: finished cells read back, the running one resumed, the report complete", async () => {
    const dir = mkdtempSync(join(tmpdir(), "marft-compare-resume-"));
    const spec = join(dir, "spec.yaml");
    writeFileSync(
      spec,
      `base: ${join(ROOT, "configs", "tiny-orchestrated.yaml")}
set: { train.tasksPerIter: 4 }
variants: [team, { name: slow, set: { "agents[0].lr": 0.005 } }]
seeds: [0]
budget: { sampledTokens: 200 }
eval: { n: 4 }
checkpointEvery: 2
`,
    );
    const out = join(dir, "out");
    const first = join(out, "cells", "team", "seed-0");
    const second = join(out, "cells", "slow", "seed-0");
    const child = marft(["compare", spec, "--out", out, "--quiet"]);
    const done = finish(child);
    await when(
      child,
      () => existsSync(join(first, "cell.json")) && existsSync(join(second, "checkpoints", "latest")),
      "its second cell's first checkpoint",
    );
    child.kill("SIGKILL");
    const k = await done;
    expect(k.signal).toBe("SIGKILL");
    expect(existsSync(join(second, "cell.json"))).toBe(false);
    const cellJson = readFileSync(join(first, "cell.json"), "utf8");
    const stamps = ["cell.json", "metrics.jsonl"].map((f) => statSync(join(first, f)).mtimeMs);

    const r = await finish(marft(["compare", spec, "--out", out, "--quiet"]));
    expect(r.code, r.out).toBe(0);
    expect(r.out).toContain("1 of 2 cells already finished");
    expect(r.out).toMatch(/slow seed 0: resuming from iteration [2-9]/);
    expect(readFileSync(join(first, "cell.json"), "utf8")).toBe(cellJson);
    expect(["cell.json", "metrics.jsonl"].map((f) => statSync(join(first, f)).mtimeMs)).toEqual(stamps);
    const report = JSON.parse(readFileSync(join(out, "compare.json"), "utf8"));
    expect(report.complete).toBe(true);
    expect(report.variants.map((v: { name: string }) => v.name)).toEqual(["team", "slow"]);
    expect(report.variants[1].seeds[0].sampled_tokens).toBeGreaterThanOrEqual(200);
    expect(r.out).toMatch(/variant\s+accuracy % \[95% CI\]/); // the table on stdout
    // the dashboard reads what marft compare writes
    const seen = readCompare(join(out, "compare.json"), "resume");
    expect(seen.variants.map((v) => [v.name, v.mean])).toEqual(
      report.variants.map((v: { name: string; mean: number }) => [v.name, v.mean]),
    );
  }, 900_000); // two short runs of the tiny model on 2 shared cores
});
