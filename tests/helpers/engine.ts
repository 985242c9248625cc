// Shared vitest helper: ONE real engine per test file, with a tiny random-init model.
//
//   const eng = useEngine();                       // registers beforeAll / afterAll
//   it("...", async () => { await eng.client.sample(...) });
//
// The engine runs on CPU with one thread (the test machine has two cores shared by everyone) and
// logs to a temporary file whose tail appears in the error when it fails to start.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll } from "vitest";
import type { EngineClient, Schemas } from "../../src/client/client.ts";
import { type Engine, startLocalEngine } from "../../src/client/launcher.ts";
import type { RunConfig } from "../../src/config/schema.ts";
import type { MetricsRow } from "../../src/train/phases.ts";
import { train } from "../../src/train/run.ts";
import { RunDir } from "../../src/train/rundir.ts";
import { runSuite } from "../../src/train/suite.ts";

export interface TestEngine {
  /** Valid inside tests (after beforeAll). */
  readonly client: EngineClient;
  readonly engine: Engine;
  readonly logFile: string;
}

/** Environment that keeps a test engine to one CPU thread. */
export const TEST_ENGINE_ENV: Record<string, string> = {
  OMP_NUM_THREADS: "1",
  MKL_NUM_THREADS: "1",
  OPENBLAS_NUM_THREADS: "1",
  TOKENIZERS_PARALLELISM: "false",
};

/** Starts an engine for a test file and stops it after the file's tests. */
export function useEngine(opts: { maxBatch?: number } = {}): TestEngine {
  let engine: Engine | undefined;
  const logFile = join(mkdtempSync(join(tmpdir(), "marft-test-engine-")), "engine.log");
  beforeAll(async () => {
    engine = await startLocalEngine({
      device: "cpu",
      logFile,
      env: TEST_ENGINE_ENV,
      maxBatch: opts.maxBatch,
    });
  });
  afterAll(async () => {
    await engine?.stop();
  });
  const need = () => {
    if (!engine) throw new Error("useEngine: the engine is not started yet (use it inside tests or hooks)");
    return engine;
  };
  return {
    get client() {
      return need().client;
    },
    get engine() {
      return need();
    },
    logFile,
  };
}

/** Loads the tiny random-init base (`tiny:llama`) under `name`. */
export function createTinyBase(client: EngineClient, name = "tiny", seed = 0): Promise<Schemas["BaseInfo"]> {
  return client.createBase({ name, source: "tiny:llama", seed, dtype: "float32" });
}

/** A policy adapter on `base` with a learning rate that moves a random-init tiny model quickly. */
export function createPolicy(
  client: EngineClient,
  name: string,
  base = "tiny",
  seed = 0,
): Promise<Schemas["AdapterInfo"]> {
  return client.createAdapter({
    name,
    base,
    kind: "policy",
    seed,
    lora: { r: 4, alpha: 8 },
    optimizer: { lr: 1e-3 },
  });
}

/** Trains `config` into `dir` end to end on a local one-thread engine; returns its metrics lines. */
export async function trainLocally(config: RunConfig, dir: string): Promise<MetricsRow[]> {
  const configDir = join(import.meta.dirname, "..", "..", "configs");
  await train({
    config,
    configDir,
    runDir: dir,
    suite: runSuite(config, "."),
    connect: () =>
      startLocalEngine({ device: "cpu", logFile: join(dir, "engine.log"), env: TEST_ENGINE_ENV }),
  });
  return new RunDir(dir).readMetrics() as MetricsRow[];
}
