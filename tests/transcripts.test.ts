// transcripts.jsonl: the records built from a hand-made batch (pure), the same credit the engine was
// trained with (the loop against the in-memory engine), and truncation on resume. The resume test
// (tests/resume.test.ts) checks that a killed and resumed run writes the uninterrupted run's file.
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadRunConfig } from "../src/config/load.ts";
import { runSuite } from "../src/train/suite.ts";
import type { Episode, Turn } from "../src/rollout/types.ts";
import { RunDir } from "../src/train/rundir.ts";
import { setupEngine } from "../src/train/setup.ts";
import type { Step } from "../src/train/steps.ts";
import { Trainer } from "../src/train/trainer.ts";
import { TranscriptRecordSchema, transcriptRecords } from "../src/train/transcripts.ts";
import { WatchFiles } from "../src/train/watch.ts";
import { FakeEngine, seededLetter } from "./helpers/fake-engine.ts";

const CONFIGS = join(import.meta.dirname, "..", "configs");
const config = (sets: string[] = []) => loadRunConfig(join(CONFIGS, "tiny-secret.yaml"), sets);

function turn(agent: string, order: number, ids: number[], parents: string[] = []): Turn {
  return {
    order,
    step: 0,
    agent,
    parents,
    adapter: agent,
    adapterVersion: 3,
    temperature: 1,
    promptIds: [1, 2, 3],
    responseIds: ids,
    logprobs: ids.map((_, j) => -0.5 - j),
    text: ids.map((i) => String.fromCharCode(96 + i)).join(""),
    finishReason: "stop",
    reward: 0,
  };
}

function episode(index: number, turns: Turn[], teamReward: number): Episode {
  return {
    index,
    taskId: `t${index}`,
    group: index,
    seed: index,
    turns,
    terminated: true,
    truncated: false,
    outcome: { correct: teamReward > 0, score: teamReward, teamReward, roleRewards: { speaker: 0.25 } },
    info: { secret: "a" },
    transcript: [
      { role: "user", content: "speaker sees: secret: aaaa" },
      { role: "user", content: "listener sees: secret?" },
      { role: "assistant", content: "speaker: abc" },
      { role: "user", content: "feedback after the first action" },
    ],
  };
}

/** Two episodes of a speaker (3 tokens) and a listener (1 token) who sees it. */
function batch(advantages: number[][]) {
  const episodes = [0, 1].map((e) =>
    episode(e, [turn("speaker", 0, [1, 2, 3]), turn("listener", 1, [1], ["speaker"])], e === 0 ? 1 : 0),
  );
  const steps: Step[] = episodes.flatMap((ep) =>
    ep.turns.map((t, k) => ({
      episode: ep.index,
      group: ep.group,
      k,
      turn: t,
      reward: k === 1 ? 1 - ep.index : 0.25,
    })),
  );
  return { episodes, steps, advantages };
}

describe("transcript records (pure)", () => {
  it("MARFT-A: the first N episodes, an action's advantage on each of its tokens, the sampler's log-probs", () => {
    const c = config(["train.transcripts=1"]); // agent-by-agent: the speaker trains first
    const recs = transcriptRecords(c, 1, batch([[0.5], [-1.5], [0.1], [2]]));
    expect(recs).toHaveLength(1);
    const r = recs[0]!;
    expect(r).toMatchObject({
      iteration: 1,
      episode: 0,
      taskId: "t0",
      level: "action",
      task: "speaker sees: secret: aaaa\nlistener sees: secret?",
      outcome: { teamReward: 1, correct: true },
      info: { secret: "a" },
    });
    expect(r.turns.map((t) => [t.agent, t.role, t.trained, t.reward, t.parents])).toEqual([
      ["speaker", "speaker", true, 0.25, []],
      ["listener", "listener", false, 1, ["speaker"]],
    ]);
    expect(r.turns[0]).toMatchObject({
      tokenIds: [1, 2, 3],
      logprobs: [-0.5, -1.5, -2.5],
      advantages: [0.5, 0.5, 0.5],
      text: "abc",
      adapterVersion: 3,
    });
    expect(r.turns[1]!.advantages).toEqual([-1.5]);
    // what the dashboard reads back
    expect(TranscriptRecordSchema.parse(JSON.parse(JSON.stringify(r)))).toEqual(r);
  });

  it("MARFT-T: one advantage per token, as given; 0 episodes writes nothing", () => {
    const c = config(["algo.estimator=marft-t", "train.schedule=joint", "train.transcripts=8"]);
    const recs = transcriptRecords(c, 4, batch([[0.5, -0.25, 1], [-1.5], [0.1, 0.2, 0.3], [2]]));
    expect(recs.map((r) => r.episode)).toEqual([0, 1]);
    expect(recs[0]!.level).toBe("token");
    expect(recs[0]!.turns[0]!.advantages).toEqual([0.5, -0.25, 1]);
    expect(recs[1]!.turns.map((t) => t.trained)).toEqual([true, true]);
    expect(transcriptRecords(config(["train.transcripts=0"]), 1, batch([[0], [0], [0], [0]]))).toEqual([]);
  });

  it("advantages that fit neither the action nor its tokens are an error naming the agent", () => {
    expect(() => transcriptRecords(config(), 1, batch([[0.5, 1], [0], [0], [0]]))).toThrow(
      /2 advantages for 3 tokens \(agent speaker\)/,
    );
  });
});

describe("transcripts of the training loop (in-memory engine)", () => {
  it("carry the advantages the policy update sent to the engine, token by token", async () => {
    const c = loadRunConfig(join(CONFIGS, "tiny-secret.yaml"), [
      "train.tasksPerIter=4",
      "train.samplesPerTask=2",
      "train.schedule=joint",
      "algo.estimator=marft-t",
      "agents[0].sampling.maxNewTokens=4",
      "train.transcripts=3",
    ]);
    const engine = new FakeEngine();
    const letter = seededLetter("ab");
    engine.textFor = (req) => (req.adapter === "speaker" ? `${letter(req)}b${letter(req)}a` : letter(req));
    await setupEngine(engine, c);
    const trainer = new Trainer(c, runSuite(c, CONFIGS), engine);
    await trainer.syncVersions();
    const row = await trainer.iteration();
    const run = new RunDir(mkdtempSync(join(tmpdir(), "marft-transcripts-")));
    run.create();
    new WatchFiles(run, c).iteration(1, row, trainer.lastBatch);

    const lines = readFileSync(run.transcriptsPath, "utf8").trim().split("\n");
    expect(lines).toHaveLength(3);
    const recs = lines.map((l) => TranscriptRecordSchema.parse(JSON.parse(l)));
    for (const rec of recs) {
      for (const t of rec.turns) {
        // the engine's PPO data for this adapter (first epoch): prompt + response, advantages on the response
        const sent = engine.trained.get(t.agent)![0]!.data.map((d) => {
          const P = d.weights!.indexOf(1);
          return { ids: d.tokens.slice(P), adv: d.advantages!.slice(P) };
        });
        expect(sent).toContainEqual({ ids: t.tokenIds, adv: t.advantages });
        expect(t.tokenIds).toHaveLength(t.agent === "speaker" ? 4 : 1);
      }
    }
    // MARFT-T: the speaker's tokens do not all share one advantage
    expect(recs.some((r) => new Set(r.turns[0]!.advantages).size > 1)).toBe(true);
  });
});

describe("truncation on resume", () => {
  const record = (iteration: number, episode: number) => JSON.stringify({ iteration, episode });

  it("keeps the iterations a checkpoint vouches for and drops a torn last line", () => {
    const run = new RunDir(mkdtempSync(join(tmpdir(), "marft-transcripts-")));
    run.create();
    run.appendTranscripts([
      { iteration: 1, episode: 0 },
      { iteration: 1, episode: 1 },
    ]);
    run.appendTranscripts([{ iteration: 2, episode: 0 }]);
    run.appendTranscripts([{ iteration: 3, episode: 0 }]);
    writeFileSync(run.transcriptsPath, `${readFileSync(run.transcriptsPath, "utf8")}{"iteration":4,"epi`);
    run.truncateTranscripts(2);
    expect(readFileSync(run.transcriptsPath, "utf8")).toBe(
      `${record(1, 0)}\n${record(1, 1)}\n${record(2, 0)}\n`,
    );
    run.truncateTranscripts(0);
    expect(readFileSync(run.transcriptsPath, "utf8")).toBe("");
  });

  it("a damaged line that is not the last is an error naming the file and line", () => {
    const run = new RunDir(mkdtempSync(join(tmpdir(), "marft-transcripts-")));
    run.create();
    writeFileSync(run.transcriptsPath, `${record(1, 0)}\nnot json\n${record(2, 0)}\n`);
    expect(() => run.truncateTranscripts(1)).toThrow(`${run.transcriptsPath}:2: not a transcript record`);
  });
});
