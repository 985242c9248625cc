import { describe, expect, it } from "vitest";
import { checkEnv } from "../src/flexmg/check.ts";
import type { AgentSpec, Env, GraphSpec } from "../src/flexmg/types.ts";
import {
  matchFraction,
  matches,
  OrchestratedEnv,
  orchestratedSuite,
  SecretEnv,
  secretSuite,
  VoteEnv,
  voteSuite,
} from "../src/envs/synthetic/index.ts";

/** What an ended episode reports: its outcome and its diagnostics. */
const ended = (env: Env) => ({ ...env.outcome(), ...env.info() });

const agent = (id: string, role = id): AgentSpec => ({ id, role, systemPrompt: `${role}.` });
const duo = [agent("A", "speaker"), agent("B", "listener")];
const voteTeam = [agent("s1"), agent("s2"), agent("agg", "aggregator")];
const orchTeam = [agent("o", "orchestrator"), agent("w1", "alice"), agent("w2", "bob")];
const voteEdges: GraphSpec = {
  kind: "edges",
  edges: [
    ["s1", "agg"],
    ["s2", "agg"],
  ],
};

/**
 * Every shipped synthetic env runs through checkEnv. (Math and code envs have their own conformance
 * tests in their test files.)
 */
const CONFORMANCE: Array<{ name: string; makeEnv: () => Env<unknown>; tasks: unknown[] }> = [
  {
    name: "secret",
    makeEnv: () => secretSuite().makeEnv(duo, { kind: "sequential" }) as Env<unknown>,
    tasks: secretSuite().train.slice(0, 4),
  },
  {
    name: "secret, 3 attempts, exact",
    makeEnv: () =>
      new SecretEnv(duo, { kind: "sequential" }, { attempts: 3, match: "exact" }) as Env<unknown>,
    tasks: secretSuite().train.slice(0, 4),
  },
  {
    name: "parallel-vote",
    makeEnv: () => new VoteEnv(voteTeam, voteEdges) as Env<unknown>,
    tasks: voteSuite().train.slice(0, 4),
  },
  {
    name: "parallel-vote, parallel graph",
    makeEnv: () => new VoteEnv(voteTeam, { kind: "parallel" }) as Env<unknown>,
    tasks: voteSuite().train.slice(0, 2),
  },
  {
    name: "orchestrated",
    makeEnv: () => new OrchestratedEnv(orchTeam, { kind: "dynamic" }) as Env<unknown>,
    tasks: orchestratedSuite().train.slice(0, 4),
  },
  {
    name: "orchestrated, exact",
    makeEnv: () => new OrchestratedEnv(orchTeam, { kind: "dynamic" }, { match: "exact" }) as Env<unknown>,
    tasks: orchestratedSuite().train.slice(0, 4),
  },
];

describe("synthetic envs conform to the Env contract", () => {
  for (const c of CONFORMANCE) {
    it(c.name, async () => {
      expect(await checkEnv(c.makeEnv, c.tasks, { seeds: [0, 3] })).toEqual([]);
    });
  }
});

describe("synthetic tasks", () => {
  it("task lists are deterministic per seed, differ across seeds, and train/eval ids are disjoint", () => {
    expect(secretSuite({ seed: 1 }).train).toEqual(secretSuite({ seed: 1 }).train);
    expect(secretSuite({ seed: 1 }).train).not.toEqual(secretSuite({ seed: 2 }).train);
    const s = secretSuite({ trainSize: 10, evalSize: 5 });
    expect(s.train).toHaveLength(10);
    expect(s.eval).toHaveLength(5);
    const ids = new Set(s.train.map(s.taskId));
    expect(s.eval.some((t) => ids.has(s.taskId(t)))).toBe(false);
    // All four secrets occur: a balanced enough task list.
    expect(new Set(secretSuite().train.map((t) => t.secret)).size).toBe(4);
  });

  it("matching: exact wants the letter; class accepts the letter's residue class", () => {
    expect(matches("c!", "c", "abcd", "exact")).toBe(true);
    expect(matches("g", "c", "abcd", "exact")).toBe(false);
    expect(matches("g", "c", "abcd", "class")).toBe(true); // 103 % 4 === 99 % 4
    expect(matches("d", "c", "abcd", "class")).toBe(false);
    expect(matches("", "c", "abcd", "class")).toBe(false);
    // U+FFFD (an undecodable byte) is in no class, though 65533 % 4 === 97 % 4.
    expect(matches("\uFFFD", "a", "abcd", "class")).toBe(false);
    expect(matches("  a", "a", "abcd", "exact")).toBe(true);
    expect(() => secretSuite({ letters: "ae" })).toThrow("differ modulo 2");
  });

  it("matchFraction: the share of upTo slots filled with the expected letter", () => {
    expect(matchFraction("aaaa", "a", "ab", "exact", 4)).toBe(1);
    expect(matchFraction("aaaaaaaa", "a", "ab", "exact", 4)).toBe(1); // only the first upTo count
    expect(matchFraction("axay", "a", "ab", "exact", 4)).toBe(0.5);
    expect(matchFraction("ac", "a", "ab", "class", 4)).toBe(0.5); // c is in a's class, unsaid slots are wrong
    expect(matchFraction(" \uFFFDb", "b", "ab", "class", 2)).toBe(0.5);
    expect(matchFraction("", "a", "ab", "class", 3)).toBe(0);
  });

  it("secret: only the speaker sees the secret; the listener sees the speaker; team reward to all", async () => {
    const env = new SecretEnv(duo, { kind: "sequential" }, { match: "exact" });
    await env.reset({ id: "t", secret: "b" }, 0);
    expect(env.observe("A")[1]!.content).toBe("secret: b");
    await env.act("A", "hello");
    expect(env.observe("B")[1]!.content).toBe("secret?\n\nspeaker: hello");
    await env.act("B", "b");
    expect(env.terminated).toBe(true);
    // the team reward is the outcome's; no per-action rewards
    expect(env.takeRewards()).toEqual({});
    expect(env.outcome().teamReward).toBe(1);
    expect(ended(env)).toMatchObject({
      correct: true,
      score: 1,
      teamReward: 1,
      secret: "b",
      roleRewards: { speaker: 0 },
    });
    // The speaker's shaping reward: its own first character states the secret; repeat fills its prompt.
    const rep = new SecretEnv(duo, { kind: "sequential" }, { match: "exact", repeat: 3 });
    await rep.reset({ id: "t", secret: "d" }, 0);
    expect(rep.observe("A")[1]!.content).toBe("secret: ddd");
    await rep.act("A", "d");
    await rep.act("B", "x");
    expect(ended(rep)).toMatchObject({ correct: false, roleRewards: { speaker: 1 } });
    // speakerChars: the share of the speaker's first N characters that state the secret.
    const many = new SecretEnv(duo, { kind: "sequential" }, { match: "exact", speakerChars: 4 });
    await many.reset({ id: "t", secret: "b" }, 0);
    await many.act("A", "bbxbzz");
    await many.act("B", "b");
    expect(ended(many)).toMatchObject({ correct: true, roleRewards: { speaker: 0.75 } });
    expect(() => new SecretEnv(duo, { kind: "sequential" }, { speakerChars: 0 })).toThrow(
      "secret.speakerChars: expected a positive integer, got 0",
    );
  });

  it("secret with attempts: wrong answers add history and retry, then terminate", async () => {
    const env = new SecretEnv(duo, { kind: "sequential" }, { match: "exact", attempts: 2 });
    await env.reset({ id: "t", secret: "a" }, 0);
    await env.act("A", "x");
    await env.act("B", "z");
    expect(env.terminated).toBe(false);
    expect(env.step()).toBe(1);
    expect(env.observe("A")[1]!.content).toBe("secret: a\n\nattempt 1: wrong");
    await env.act("A", "x");
    await env.act("B", "z");
    expect(env.terminated).toBe(true);
    expect(env.takeRewards()).toEqual({});
    expect(env.outcome().teamReward).toBe(0);
  });

  it("parallel-vote: solvers concurrently, each with its own pair; the aggregator combines both bits", async () => {
    const env = new VoteEnv(voteTeam, voteEdges, { match: "exact" });
    await env.reset({ id: "t", bits: [1, 0] }, 0);
    expect(env.ready()).toEqual(["s1", "s2"]);
    // solver 1 says its bit with a/b, solver 2 with c/d
    expect(env.observe("s1")[1]!.content).toBe("letter: b");
    expect(env.observe("s2")[1]!.content).toBe("letter: c");
    await Promise.all([env.act("s2", "cx"), env.act("s1", "a")]);
    expect(env.observe("agg")[1]!.content).toBe("letter?\n\ns1: a\ns2: cx");
    await env.act("agg", "c"); // bits 10 -> letter number 2 -> "c"
    expect(env.terminated).toBe(true);
    expect(env.takeRewards()).toEqual({});
    expect(env.outcome().teamReward).toBe(1);
    expect(ended(env)).toMatchObject({
      correct: true,
      score: 1,
      expected: "c",
      bitsRight: 2,
      // s1 said the other letter of its pair: penalised; s2's first character states its letter
      roleRewards: { s1: -1, s2: 1 },
    });
  });

  it("parallel-vote: each bit the answer gets right earns 1/n; a non-letter earns nothing", async () => {
    const rewardFor = async (bits: number[], answer: string) => {
      const env = new VoteEnv(voteTeam, voteEdges, { match: "exact" });
      await env.reset({ id: "t", bits }, 0);
      await Promise.all([env.act("s1", "?"), env.act("s2", "?")]);
      await env.act("agg", answer);
      return ended(env);
    };
    expect(await rewardFor([1, 1], "d")).toMatchObject({ teamReward: 1, correct: true });
    expect(await rewardFor([1, 1], "c")).toMatchObject({ teamReward: 0.5, correct: false, bitsRight: 1 });
    expect(await rewardFor([1, 1], "b")).toMatchObject({ teamReward: 0.5, bitsRight: 1 });
    expect(await rewardFor([1, 1], "a")).toMatchObject({ teamReward: 0, bitsRight: 0 });
    expect(await rewardFor([0, 1], "z")).toMatchObject({ teamReward: 0 });
    // class matching: "y" (121 % 4 === 97 % 4) answers "a"; special tokens are no character
    const cls = new VoteEnv(voteTeam, voteEdges);
    await cls.reset({ id: "t", bits: [0, 0] }, 0);
    await Promise.all([cls.act("s1", "<|pad|>"), cls.act("s2", "<|endoftext|>")]);
    await cls.act("agg", "y");
    expect(ended(cls)).toMatchObject({ teamReward: 1, roleRewards: { s1: 0, s2: 0 } });
  });

  it("parallel-vote: an aggregator that ignores the solvers earns at most 1/2 (and all bits 1/4)", async () => {
    // Every fixed answer, averaged over the four equally likely bit pairs.
    for (const answer of ["a", "b", "c", "d"]) {
      let reward = 0;
      let correct = 0;
      for (const bits of [
        [0, 0],
        [0, 1],
        [1, 0],
        [1, 1],
      ]) {
        const env = new VoteEnv(voteTeam, voteEdges);
        await env.reset({ id: "t", bits }, 0);
        await Promise.all([env.act("s1", ""), env.act("s2", "")]);
        await env.act("agg", answer);
        reward += env.outcome().teamReward / 4;
        correct += env.outcome().correct ? 1 / 4 : 0;
      }
      expect(reward).toBe(0.5);
      expect(correct).toBe(0.25);
    }
  });

  it("parallel-vote: solverChars, repeat and solvers; bad values are refused by name", async () => {
    const env = new VoteEnv(voteTeam, voteEdges, { repeat: 4, solverChars: 4 });
    await env.reset({ id: "t", bits: [0, 1] }, 0);
    expect(env.observe("s1")[1]!.content).toBe("letter: aaaa");
    expect(env.observe("s2")[1]!.content).toBe("letter: dddd");
    // class matching over abcd: "e" is in a's class, "b" the other letter (a penalty), "x" (120 % 4 ===
    // 100 % 4) in d's class: no letter of solver 1's pair, one of solver 2's
    await Promise.all([env.act("s1", "aebx"), env.act("s2", "dxd")]);
    await env.act("agg", "b");
    expect(ended(env)).toMatchObject({ correct: true, roleRewards: { s1: 0.25, s2: 0.75 } });
    // penalty weighs the other letter's share: 0.5 -> s1 earns 2/4 - 0.5 * 1/4
    const half = new VoteEnv(voteTeam, voteEdges, { solverChars: 4, penalty: 0.5 });
    await half.reset({ id: "t", bits: [0, 1] }, 0);
    await Promise.all([half.act("s1", "aebx"), half.act("s2", "dxd")]);
    await half.act("agg", "b");
    expect(ended(half)).toMatchObject({ roleRewards: { s1: 0.375, s2: 0.75 } });
    expect(() => new VoteEnv(voteTeam, voteEdges, { penalty: 2 })).toThrow(/parallel-vote\.penalty/);
    const trio = [agent("s1"), agent("s2"), agent("s3"), agent("agg", "aggregator")];
    const edges3: GraphSpec = {
      kind: "edges",
      edges: [
        ["s1", "agg"],
        ["s2", "agg"],
        ["s3", "agg"],
      ],
    };
    const three = new VoteEnv(trio, edges3, { solvers: 3, match: "exact" });
    await three.reset({ id: "t", bits: [1, 0, 1] }, 0);
    expect(three.observe("s3")[1]!.content).toBe("letter: f");
    await Promise.all([three.act("s1", "b"), three.act("s2", "c"), three.act("s3", "f")]);
    await three.act("agg", "f"); // 101 -> letter number 5
    expect(ended(three)).toMatchObject({ correct: true, roleRewards: { s1: 1, s2: 1, s3: 1 } });
    expect(voteSuite({ solvers: 3 }).train.every((t) => t.bits.length === 3)).toBe(true);
    expect(() => new VoteEnv(voteTeam, voteEdges, { repeat: 0 })).toThrow(/parallel-vote\.repeat/);
    expect(() => new VoteEnv(voteTeam, voteEdges, { solverChars: 1.5 })).toThrow(
      /parallel-vote\.solverChars/,
    );
    expect(() => new VoteEnv(voteTeam, voteEdges, { solvers: 3 })).toThrow(
      "expected at least 4 agents, got 3",
    );
  });

  it("orchestrated: the orchestrator's output routes to a worker that sees it", async () => {
    const env = new OrchestratedEnv(orchTeam, { kind: "dynamic" }, { match: "exact" });
    await env.reset({ id: "t", expert: 1, secret: "d" }, 0);
    expect(env.ready()).toEqual(["o"]);
    expect(env.observe("o")[1]!.content).toBe("expert: 2");
    await env.act("o", "ask bob");
    expect(env.ready()).toEqual(["w2"]);
    expect(env.observe("w2")[1]!.content).toBe("secret: d\n\norchestrator: ask bob");
    await env.act("w2", "d");
    expect(ended(env)).toMatchObject({ correct: true, chosen: "w2", roleRewards: { orchestrator: 1 } });
    // An output naming nobody ends the episode with 0 in exact mode.
    await env.reset({ id: "t", expert: 0, secret: "a" }, 0);
    await env.act("o", "?");
    expect(env.terminated).toBe(true);
    expect(env.takeRewards()).toEqual({});
    expect(env.outcome().teamReward).toBe(0);
  });

  it("a random policy sometimes earns the reward in class mode (learnable from random init)", async () => {
    const suite = secretSuite({ trainSize: 200 });
    let wins = 0;
    let x = 12345;
    for (const task of suite.train) {
      const env = suite.makeEnv(duo, { kind: "sequential" });
      await env.reset(task, 0);
      x = (x * 1103515245 + 12345) % 2147483648;
      await env.act("A", String.fromCharCode(32 + (x % 200)));
      x = (x * 1103515245 + 12345) % 2147483648;
      await env.act("B", String.fromCharCode(32 + (x % 200)));
      wins += env.outcome().teamReward;
    }
    expect(wins).toBeGreaterThan(20);
    expect(wins).toBeLessThan(90);
  });
});
