// The client never kills a working run: a call lasts as long as the engine makes progress, and fails
// only when the engine is gone or stalled for the stall limit, with a message that says what stalled,
// how long, the last checkpoint and the --resume command. Stall limits are small here so the tests
// run fast; the engine is slowed or stalled on purpose (MARFT_ENGINE_TEST_DELAY, engine/delays.py).
import { spawnSync } from "node:child_process";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { existsSync, mkdtempSync, readdirSync, readFileSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EngineClient } from "../src/client/client.ts";
import { type Engine, startLocalEngine } from "../src/client/launcher.ts";
import { type EngineError, EngineStalledError, EngineUnreachableError } from "../src/errors.ts";
import { createPolicy, createTinyBase, TEST_ENGINE_ENV } from "./helpers/engine.ts";

const ROOT = join(import.meta.dirname, "..");

async function caught(p: Promise<unknown>): Promise<EngineError> {
  try {
    await p;
  } catch (e) {
    return e as EngineError;
  }
  throw new Error("expected the call to fail");
}

/** A stand-in engine: /v1/forward answers after `answerMs` (never if null); /v1/health per `health`. */
async function standIn(
  answerMs: number | null,
  health: "progress" | "still" | "silent",
): Promise<{ server: Server; url: string }> {
  let beats = 0;
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const reply = (body: unknown) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (req.url === "/v1/health") {
      if (health === "silent") return; // never answers
      if (health === "progress") beats++;
      reply({ status: "ok", version: "0", device: "cpu", progress: { beats, compute_cpu_seconds: 0 } });
      return;
    }
    if (answerMs !== null) setTimeout(() => reply({ results: [{ logprobs: [0, -1] }] }), answerMs);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

const forward = (c: EngineClient) => c.forward({ adapter: "p", data: [{ tokens: [1, 2] }] });

describe("the liveness watch (stand-in engines)", () => {
  it("a call that takes many stall limits succeeds while the engine shows progress", async () => {
    const s = await standIn(1500, "progress");
    const c = new EngineClient({ url: s.url, token: "t", stallMs: 300, pollMs: 50 });
    expect((await forward(c)).results[0]!.logprobs).toEqual([0, -1]);
    s.server.close();
  });

  it("an engine that answers health but makes no progress: EngineStalledError after the limit", async () => {
    const s = await standIn(null, "still");
    const c = new EngineClient({ url: s.url, token: "t", stallMs: 300, pollMs: 50 });
    const t0 = performance.now();
    const e = await caught(forward(c));
    expect(e).toBeInstanceOf(EngineStalledError);
    expect(performance.now() - t0).toBeLessThan(2000);
    expect(e.message).toMatch(
      /^POST \/v1\/forward: stalled: the engine made no progress for 0\.\d s while this call waited .*it answers \/v1\/health; the limit is engine\.stallSeconds = 0\.3\)$/,
    );
    s.server.closeAllConnections();
    s.server.close();
  });

  it("an engine that stops answering at all is stalled too", async () => {
    const s = await standIn(null, "silent");
    const c = new EngineClient({ url: s.url, token: "t", stallMs: 300, pollMs: 50 });
    const e = await caught(forward(c));
    expect(e).toBeInstanceOf(EngineStalledError);
    expect(e.message).toContain("it does not answer /v1/health");
    s.server.closeAllConnections();
    s.server.close();
  });

  it("an engine that is gone fails the call at once as unreachable", async () => {
    const s = await standIn(null, "still");
    const c = new EngineClient({ url: s.url, token: "t", stallMs: 60_000, pollMs: 50 });
    const pending = caught(forward(c));
    await new Promise((r) => setTimeout(r, 100));
    s.server.close(); // stops listening; the call's own connection stays open
    const e = await pending;
    expect(e).toBeInstanceOf(EngineUnreachableError);
    expect(e.message).toContain("stopped accepting connections while this call waited");
    s.server.closeAllConnections();
  });
});

describe("a real engine slowed and stalled on purpose", () => {
  let engine: Engine;
  beforeAll(async () => {
    engine = await startLocalEngine({
      device: "cpu",
      logFile: join(mkdtempSync(join(tmpdir(), "marft-live-")), "engine.log"),
      env: { ...TEST_ENGINE_ENV, MARFT_ENGINE_TEST_DELAY: "forward=2.5,optim_step=4:stall" },
      stallMs: 800,
    });
    await createTinyBase(engine.client);
    await createPolicy(engine.client, "p");
  });
  afterAll(async () => {
    await engine.stop();
  });

  it("a working call three times the stall limit succeeds; a stalled one fails with the message", async () => {
    const t0 = performance.now();
    const r = await engine.client.forward({ adapter: "p", data: [{ tokens: [1, 2, 3] }] });
    expect(performance.now() - t0).toBeGreaterThan(2400);
    expect(r.results[0]!.logprobs).toHaveLength(3);
    const e = await caught(engine.client.optimStep({ adapter: "p" }));
    expect(e).toBeInstanceOf(EngineStalledError);
    expect(e.message).toMatch(/^POST \/v1\/optim_step: stalled: the engine made no progress for \d\.\d s/);
    // the engine itself is fine once the stall is over
    await new Promise((res) => setTimeout(res, 4000));
    expect((await engine.client.health()).status).toBe("ok");
  });
});

describe("marft train with a stalled engine", () => {
  it("exits 1 with what stalled, the last checkpoint and the --resume command", () => {
    const dir = join(mkdtempSync(join(tmpdir(), "marft-stall-")), "run");
    const r = spawnSync(
      process.execPath,
      [
        join(ROOT, "bin", "marft.mjs"),
        "train",
        join(ROOT, "configs", "tiny-secret.yaml"),
        "--run-dir",
        dir,
        "--quiet",
        ...["--set", "train.iterations=2", "--set", "train.checkpointEvery=1", "--set", "train.evalEvery=2"],
        ...["--set", "train.tasksPerIter=2", "--set", "train.samplesPerTask=1", "--set", "eval.n=2"],
        ...["--set", "engine.stallSeconds=1"],
      ],
      {
        cwd: ROOT,
        // evaluation is the only greedy sampling: the run stalls after its first checkpoint
        env: { ...process.env, ...TEST_ENGINE_ENV, MARFT_ENGINE_TEST_DELAY: "sample_greedy=15:stall" },
        encoding: "utf8",
        timeout: 110_000,
      },
    );
    expect(r.status, r.stderr).toBe(1);
    expect(r.stderr).toMatch(
      /marft train: POST \/v1\/sample: stalled: the engine made no progress for \d+\.\d s while this call waited/,
    );
    expect(r.stderr).toContain(`  last checkpoint: ${dir}/checkpoints/iter_1 (iteration 1)\n`);
    expect(r.stderr).toContain(`  continue with: marft train --resume ${dir}\n`);
    expect(r.stderr).not.toContain("internal error");
    // the lock is released, nothing temporary is left
    expect(existsSync(join(dir, "trainer.lock"))).toBe(false);
    expect(readdirSync(join(dir, "checkpoints")).filter((n) => n.includes(".tmp-"))).toEqual([]);
    expect(readFileSync(join(dir, "engine.log"), "utf8")).toContain("test delay: sample_greedy stalls");
  });
});
