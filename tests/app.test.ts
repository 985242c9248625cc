// Training an app, the parts that are not learning: error episodes (a run that throws, times out,
// returns no reward or records nothing is counted and logged, never trained on, and the rollout
// goes on; its late calls are refused), and `marft train-app` from the command line with --resume.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { describe, expect, it } from "vitest";
import * as openaiDuo from "../examples/openai-duo/app.ts";
import { type SecretTask, tasks } from "../examples/secret.ts";
import { type AppContext, appSource } from "../src/app/source.ts";
import { appRunConfig } from "../src/app/train-app.ts";
import { TEST_ENGINE_ENV } from "./helpers/engine.ts";
import { useGateway } from "./helpers/gateway.ts";

const ROOT = join(import.meta.dirname, "..");
const TEAM = join(ROOT, "examples", "team.yaml");
const gw = useGateway({ config: TEAM });

describe("app episodes that fail", () => {
  it("are counted, logged and left out; the rollout goes on; a timed-out run's late calls are refused", async () => {
    const logs: string[] = [];
    let lateStatus = 0;
    // by task index mod 5: throws, hangs past the timeout, returns no reward, calls nothing, works
    const faulty = async (task: SecretTask, ctx: AppContext) => {
      const k = Number(task.id.split("-")[1]) % 5;
      if (k === 0) throw new Error("boom: the app crashed");
      if (k === 1) {
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
        const late = new OpenAI({
          baseURL: ctx.baseURL,
          apiKey: ctx.apiKey,
          defaultHeaders: ctx.headers,
          maxRetries: 0,
        });
        lateStatus = await late.chat.completions
          .create({ model: "solver", messages: [{ role: "user", content: "late" }] })
          .then(() => 200)
          .catch((e: { status?: number }) => e.status ?? -1);
        return 1;
      }
      if (k === 2) return "a string is not a reward" as unknown as number;
      if (k === 3) return 1;
      return openaiDuo.run(task, ctx);
    };
    const train = tasks.train.slice(0, 10);
    const source = appSource({
      name: "faulty",
      train,
      eval: train,
      run: faulty,
      gateway: gw.gateway,
      token: gw.token,
      timeoutMs: 1500,
      log: (l) => logs.push(l),
    });
    const { config } = appRunConfig(TEAM);
    const r = await source.play({ engine: gw.engine, config, tasks: train, samplesPerTask: 1, seed: 3 });
    expect(r.episodes.map((e) => e.index)).toEqual([4, 9]);
    expect(r.episodes.every((e) => e.turns.length === 2)).toBe(true);
    expect(r.stats.errors).toBe(8);
    expect(r.stats.turns).toBe(4);
    const joined = logs.join("\n");
    expect(joined).toContain("boom: the app crashed");
    expect(joined).toContain("timed out after 1.5 s");
    expect(joined).toContain('run returned "a string is not a reward"');
    expect(joined).toContain("recorded no turn");
    expect(logs).toHaveLength(8);
    await new Promise((resolve) => setTimeout(resolve, 500)); // the hung runs' late calls
    expect(lateStatus).toBe(409);
    // a rollout with nothing to train on stops the run, naming the first failure
    await expect(
      source.play({ engine: gw.engine, config, tasks: [train[0]!], samplesPerTask: 2, seed: 4 }),
    ).rejects.toThrow(/all 2 app episodes of the rollout failed; the first: .*boom/);
  });
});

function marft(args: string[]) {
  return spawnSync(process.execPath, [join(ROOT, "bin", "marft.mjs"), ...args], {
    cwd: ROOT,
    env: { ...process.env, ...TEST_ENGINE_ENV },
    encoding: "utf8",
    timeout: 300_000,
  });
}

describe("marft train-app", () => {
  it("trains an app module from the command line, and --resume continues it", () => {
    const dir = join(mkdtempSync(join(tmpdir(), "marft-train-app-")), "run");
    const app = join(ROOT, "examples", "openai-duo", "app.ts");
    const small = ["--set", "train.tasksPerIter=4", "--set", "train.samplesPerTask=2", "--set", "eval.n=4"];
    const first = marft([
      "train-app",
      TEAM,
      "--app",
      app,
      "--run-dir",
      dir,
      "--set",
      "train.iterations=1",
      ...small,
    ]);
    expect(first.status, first.stderr).toBe(0);
    expect(first.stdout).toContain("reward (first iteration)");
    expect(first.stdout).toContain(`serve it: marft serve ${dir}`);
    const metrics = () =>
      readFileSync(join(dir, "metrics.jsonl"), "utf8")
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as Record<string, number>);
    expect(metrics()).toHaveLength(1);
    expect(metrics()[0]!["episodes/errors"]).toBe(0);
    expect(metrics()[0]!["episodes/turns_mean"]).toBe(2);
    const again = marft([
      "train-app",
      "--resume",
      dir,
      "--app",
      app,
      "--set",
      "train.iterations=2",
      ...small,
    ]);
    expect(again.status, again.stderr).toBe(0);
    expect(again.stderr).toContain("resuming");
    expect(metrics().map((m) => m["iteration"])).toEqual([1, 2]);
    const summary = JSON.parse(readFileSync(join(dir, "summary.json"), "utf8")) as { iterations: number };
    expect(summary.iterations).toBe(2);
  }, 600_000);

  it("says what is wrong with a bad app module or a config for another task", () => {
    const bad = marft(["train-app", TEAM, "--app", join(ROOT, "examples", "secret.ts")]);
    expect(bad.status).toBe(2);
    expect(bad.stderr).toContain("not an app module");
    expect(bad.stderr).toContain("run: expected an exported function run(task, context)");
    const env = marft(["train-app", join(ROOT, "configs", "tiny-secret.yaml"), "--app", "x.ts"]);
    expect(env.status).toBe(2);
    expect(env.stderr).toContain('task.kind: expected "app" for an app run, got "secret"');
    const wrongWay = marft(["train", TEAM]);
    expect(wrongWay.status).toBe(2);
    expect(wrongWay.stderr).toContain("marft train-app");
  });
});
