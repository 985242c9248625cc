// A run directory written by hand, as `marft train` leaves it: config.yaml, metrics.jsonl,
// transcripts.jsonl (and summary.json when finished). For the dashboard's and the report's tests.
import { appendFileSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { configToYaml, loadRunConfig } from "../../src/config/load.ts";
import type { TranscriptRecord } from "../../src/train/transcripts.ts";

const CONFIG = join(import.meta.dirname, "..", "..", "configs", "tiny-secret.yaml");

export function metricsRow(iteration: number): Record<string, number | null> {
  return {
    iteration,
    "reward/mean": iteration / 10,
    "reward/speaker": iteration / 20,
    "reward/listener": iteration / 10,
    "kl/speaker": 0.01 * iteration,
    "kl/listener": 0.02 * iteration,
    "entropy/speaker": 5 - iteration / 10,
    "value/explained_variance": null,
    "time/rollout": 0.5,
  };
}

/** Iteration `iteration`'s episode `episode`: a speaker (3 tokens) and a listener who sees it. */
export function transcript(iteration: number, episode: number, text = "abc"): TranscriptRecord {
  const turn = (agent: string, order: number, ids: number[], adv: number[], parents: string[]) => ({
    agent,
    role: agent,
    step: 0,
    order,
    parents,
    adapterVersion: iteration - 1,
    trained: true,
    text,
    finishReason: "length",
    reward: 0.5,
    tokenIds: ids,
    logprobs: ids.map(() => -1.5),
    advantages: adv,
  });
  return {
    iteration,
    episode,
    group: episode,
    taskId: `train-${episode}`,
    task: "speaker sees: secret: a",
    level: "token",
    outcome: { correct: episode === 0, score: 1, teamReward: episode === 0 ? 1 : 0, roleRewards: {} },
    terminated: true,
    truncated: false,
    info: { secret: "a" },
    turns: [
      turn("speaker", 0, [97, 98, 99], [0.5, -0.5, 0], []),
      turn("listener", 1, [97], [-1], ["speaker"]),
    ],
  };
}

/** A run of the tiny-secret config with `iterations` metrics lines and two transcripts per iteration. */
export function writeRun(
  dir: string,
  iterations: number,
  opts: { total?: number; finished?: boolean } = {},
): void {
  mkdirSync(dir, { recursive: true });
  const config = loadRunConfig(CONFIG, [`train.iterations=${opts.total ?? iterations}`]);
  writeFileSync(join(dir, "config.yaml"), configToYaml(config));
  writeFileSync(join(dir, "metrics.jsonl"), "");
  writeFileSync(join(dir, "transcripts.jsonl"), "");
  for (let i = 1; i <= iterations; i++) appendIteration(dir, i);
  if (opts.finished) {
    writeFileSync(
      join(dir, "summary.json"),
      JSON.stringify({
        name: "x",
        iterations,
        stoppedEarly: false,
        eval: { after: { iteration: iterations, accuracy: 0.5, ci95: [0.2, 0.8], n: 8 } },
      }),
    );
  }
}

export function appendIteration(dir: string, i: number): void {
  appendFileSync(join(dir, "metrics.jsonl"), `${JSON.stringify(metricsRow(i))}\n`);
  appendFileSync(
    join(dir, "transcripts.jsonl"),
    `${JSON.stringify(transcript(i, 0))}\n${JSON.stringify(transcript(i, 1))}\n`,
  );
}
