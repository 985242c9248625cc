import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { datasetsDir } from "../src/envs/datasets.ts";
import { checkEnv } from "../src/flexmg/check.ts";
import type { AgentSpec, GraphSpec } from "../src/flexmg/types.ts";
import { createMathSuite, MathEnv, type MathProblem } from "../src/envs/math/env.ts";
import { parseMathOptions } from "../src/envs/math/task.ts";
import { closeSharedSymbolicPool } from "../src/envs/math/pool.ts";

afterAll(() => closeSharedSymbolicPool());

const DATA = datasetsDir();
const duo: AgentSpec[] = [
  { id: "reasoner", role: "reasoner", systemPrompt: "Plan the solution. Do not compute the answer." },
  { id: "actor", role: "actor", systemPrompt: "Follow the plan; put the answer in \\boxed{}." },
];
const trio: AgentSpec[] = [...duo, { id: "verifier", role: "verifier", systemPrompt: "Check and answer." }];
const problems: MathProblem[] = [
  { id: "p0", problem: "What is 1/2 + 1/2?", answer: "1" },
  { id: "p1", problem: "Compute 1+1.", answer: "2" },
  { id: "p2", problem: "Simplify (x+1)^2 - x^2 - 2x.", answer: "1" },
];

/** Runs one episode with scripted texts per agent per attempt; returns what the trainer would see. */
async function play(env: MathEnv, problem: MathProblem, script: Record<string, string[]>) {
  await env.reset(problem, 0);
  const rewards: Array<Record<string, number>> = [];
  const observations: Record<string, string[]> = {};
  while (!env.terminated && !env.truncated) {
    const ready = env.ready();
    expect(ready.length).toBeGreaterThan(0);
    await Promise.all(
      ready.map((a) => {
        observations[a] = [...(observations[a] ?? []), env.observe(a).at(-1)!.content];
        return env.act(a, script[a]![env.step()] ?? "");
      }),
    );
    rewards.push(env.takeRewards());
  }
  // the outcome and the diagnostics; takeRewards() carries per-action rewards only (none in math)
  return {
    rewards: rewards.filter((r) => Object.keys(r).length > 0),
    observations,
    info: { ...env.outcome(), ...env.info() } as Record<string, unknown>,
  };
}

describe("MathEnv passes checkEnv", () => {
  const graphs: Array<[string, AgentSpec[], GraphSpec]> = [
    ["sequential duo", duo, { kind: "sequential" }],
    ["parallel trio", trio, { kind: "parallel" }],
    [
      "edges trio",
      trio,
      {
        kind: "edges",
        edges: [
          ["reasoner", "actor"],
          ["reasoner", "verifier"],
        ],
      },
    ],
    ["dynamic trio", trio, { kind: "dynamic" }],
  ];
  for (const [name, agents, graph] of graphs) {
    for (const attempts of [1, 3]) {
      it(`${name}, ${attempts} attempt(s)`, async () => {
        const suite = createMathSuite({ train: problems, attempts });
        const problemsFound = await checkEnv(() => suite.makeEnv(agents, graph), problems, { seeds: [0, 1] });
        expect(problemsFound).toEqual([]);
      });
    }
  }

  it("truncated when cut before the last attempt", async () => {
    const suite = createMathSuite({ train: problems, attempts: 3, cutAfter: 2 });
    expect(await checkEnv(() => suite.makeEnv(duo, { kind: "sequential" }), problems)).toEqual([]);
  });
});

describe("MathEnv episodes", () => {
  it("judges each attempt, shows the judge line to the next attempt, ends when correct", async () => {
    const env = new MathEnv(duo, { kind: "sequential" }, { attempts: 3 });
    const { rewards, observations, info } = await play(env, problems[0]!, {
      reasoner: ["Add the halves.", "Add them again, carefully."],
      actor: ["So it is \\boxed{2}.", "Then \\boxed{\\frac{2}{2}}."],
    });
    expect(rewards).toEqual([]);
    expect(env.terminated).toBe(true);
    expect(env.truncated).toBe(false);
    expect(info).toMatchObject({ correct: true, score: 1, attempts: 2, rewards: [0, 1] });
    expect(info["answers"]).toEqual({ actor: "\\frac{2}{2}" });
    // the actor sees the reasoner's action of the same attempt; the second attempt sees the first and the judge
    expect(observations["actor"]![0]).toContain("reasoner: Add the halves.");
    expect(observations["reasoner"]![1]).toContain(
      "Attempt 1:\nreasoner: Add the halves.\nactor: So it is \\boxed{2}.",
    );
    expect(observations["reasoner"]![1]).toContain("The answer is incorrect.");
    expect(env.state().at(-1)!.content).toBe("The answer is correct.");
  });

  it("stops after the last attempt (terminated) or at cutAfter (truncated)", async () => {
    const wrong = { reasoner: ["x", "x", "x"], actor: ["\\boxed{3}", "\\boxed{4}", "\\boxed{5}"] };
    const env = new MathEnv(duo, { kind: "sequential" }, { attempts: 3 });
    const a = await play(env, problems[1]!, wrong);
    expect(a.info).toMatchObject({ correct: false, score: 0, attempts: 3 });
    expect(env.terminated && !env.truncated).toBe(true);
    const cut = new MathEnv(duo, { kind: "sequential" }, { attempts: 3, cutAfter: 2 });
    const b = await play(cut, problems[1]!, wrong);
    expect(b.info).toMatchObject({ attempts: 2 });
    expect(cut.truncated && !cut.terminated).toBe(true);
  });

  it("rewards the fraction of answering agents that are right", async () => {
    const env = new MathEnv(trio, { kind: "sequential" });
    const { rewards, info } = await play(env, problems[2]!, {
      reasoner: ["Expand the square."],
      actor: ["\\boxed{1}"],
      verifier: ["I get \\boxed{2x+1}"],
    });
    expect(rewards).toEqual([]);
    expect(info).toMatchObject({ correct: false, score: 0.5, teamReward: 0.5, rewards: [0.5] });
  });

  it("per-role rewards: format for answering roles, no final answer for planning roles", async () => {
    const env = new MathEnv(duo, { kind: "sequential" });
    const good = await play(env, problems[1]!, { reasoner: ["Add one and one."], actor: ["It is 2."] });
    expect(good.info["roleRewards"]).toEqual({ reasoner: 1, actor: 0 });
    const bad = await play(env, problems[1]!, { reasoner: ["\\boxed{2}"], actor: ["\\boxed{2}"] });
    expect(bad.info["roleRewards"]).toEqual({ reasoner: 0, actor: 1 });
    expect(bad.info["correct"]).toBe(true);
  });

  it("answerRoles and extraction modes are options", async () => {
    const env = new MathEnv(
      duo,
      { kind: "sequential" },
      { answerRoles: ["reasoner", "actor"], extract: "last-number" },
    );
    const r = await play(env, problems[1]!, { reasoner: ["1+1 is 2"], actor: ["so 3"] });
    expect(r.info).toMatchObject({ score: 0.5, answers: { reasoner: "2", actor: "3" } });
    expect(() => new MathEnv(duo, { kind: "sequential" }, { answerRoles: ["judge"] })).toThrow(
      /math.answerRoles/,
    );
    expect(() => new MathEnv(duo, { kind: "sequential" }, { attempts: 0 })).toThrow(/math.attempts/);
  });

  it("step rewards: each step role is paid for its own intermediate result", async () => {
    const team: AgentSpec[] = [
      { id: "stepper", role: "stepper", systemPrompt: "The count after the first change." },
      { id: "actor", role: "actor", systemPrompt: "The final count." },
    ];
    const opts = { extract: "last-number" as const, answerRoles: ["actor"], stepRoles: ["stepper"] };
    const env = new MathEnv(team, { kind: "sequential" }, opts);
    const p: MathProblem = { id: "s", problem: "Has 5, gets 3, loses 2.", answer: "6", steps: ["8"] };
    const right = await play(env, p, { stepper: ["8"], actor: ["8 - 2 = 6"] });
    expect(right.info).toMatchObject({ correct: true, roleRewards: { step1: 1 } });
    // a wrong step with a right answer: the step reward and the team reward are separate signals
    const wrong = await play(env, p, { stepper: ["7"], actor: ["6"] });
    expect(wrong.info).toMatchObject({ correct: true, score: 1, roleRewards: { step1: 0 } });
    const none = await play(env, p, { stepper: ["first"], actor: ["5"] });
    expect(none.info).toMatchObject({ correct: false, roleRewards: { step1: 0 } });
    await expect(env.reset({ id: "q", problem: "1+1", answer: "2" }, 0)).rejects.toThrow(
      /math.stepRoles: 1 step roles, but problem q has 0/,
    );
    expect(() => new MathEnv(team, { kind: "sequential" }, { stepRoles: ["judge"] })).toThrow(
      /math.stepRoles: no agent has the role "judge"/,
    );
  });

  it("splitParts: each step role sees its part, and the next agent its part with the step's number in it", async () => {
    const team: AgentSpec[] = [
      { id: "stepper", role: "stepper", systemPrompt: "Answer with only the final number." },
      { id: "actor", role: "actor", systemPrompt: "Answer with only the final number." },
    ];
    const opts = {
      extract: "last-number" as const,
      answerRoles: ["actor"],
      stepRoles: ["stepper"],
      splitParts: true,
    };
    const env = new MathEnv(team, { kind: "sequential" }, opts);
    const p: MathProblem = {
      id: "s",
      problem:
        "Tom has 5 pens. Tom gets 3 more pens. Then Tom loses 2 pens. How many pens does Tom have now?",
      answer: "6",
      steps: ["8"],
      parts: [
        "Tom has 5 pens. Tom gets 3 more pens. How many pens does Tom have now?",
        "Tom has {step1} pens. Tom loses 2 pens. How many pens does Tom have now?",
      ],
    };
    await env.reset(p, 0);
    // the stepper sees only the first change, never the second
    expect(env.observe("stepper")[1]!.content).toBe(p.parts![0]);
    await env.act("stepper", "Tom has 5 + 3 = 7 pens");
    // the actor starts from the number the stepper stated (wrong here), not from the gold step
    expect(env.observe("actor")[1]!.content).toBe(
      "Tom has 7 pens. Tom loses 2 pens. How many pens does Tom have now?",
    );
    await env.act("actor", "5");
    expect({ ...env.outcome(), ...env.info() }).toMatchObject({ correct: false, roleRewards: { step1: 0 } });
    // a stepper that states no number leaves a visible gap
    await env.reset(p, 0);
    await env.act("stepper", "Tom has some pens");
    expect(env.observe("actor")[1]!.content).toContain("Tom has ? pens.");
    // a part without placeholders is shown with the parents' actions, as usual
    const plain = { ...p, parts: [p.parts![0]!, "Then Tom loses 2 pens. How many now?"] };
    await env.reset(plain, 0);
    await env.act("stepper", "8");
    expect(env.observe("actor")[1]!.content).toBe("Then Tom loses 2 pens. How many now?\n\nstepper: 8");
    // bad data and options are named
    await expect(env.reset({ ...p, parts: [p.parts![0]!] }, 0)).rejects.toThrow(
      /math.splitParts: problem s has 1 parts, expected 2/,
    );
    await expect(env.reset({ ...p, parts: [p.parts![0]!, "{step2} left"] }, 0)).rejects.toThrow(
      /math.splitParts: problem s names \{step2\}, but there are 1 step roles/,
    );
    expect(() => new MathEnv(team, { kind: "sequential" }, { splitParts: true })).toThrow(
      /math.splitParts: expected stepRoles/,
    );
  });

  it("dynamic graph: the orchestrator names who acts next", async () => {
    const team: AgentSpec[] = [
      { id: "boss", role: "orchestrator", systemPrompt: "Name the agent who should answer." },
      { id: "alice", role: "solver", systemPrompt: "Answer in \\boxed{}." },
      { id: "bob", role: "solver", systemPrompt: "Answer in \\boxed{}." },
    ];
    const env = new MathEnv(team, { kind: "dynamic" });
    await env.reset(problems[1]!, 0);
    expect(env.ready()).toEqual(["boss"]);
    await env.act("boss", "bob should do it");
    expect(env.ready()).toEqual(["bob"]);
    expect(env.parents("bob")).toEqual(["boss"]);
    expect(env.observe("bob").at(-1)!.content).toContain("orchestrator: bob should do it");
    await env.act("bob", "\\boxed{2}");
    expect(env.terminated).toBe(true);
    expect({ ...env.outcome(), ...env.info() }).toMatchObject({
      correct: true,
      score: 1,
      answers: { bob: "2" },
    });
  });

  it("nobody is ready while the attempt's answer checks run", async () => {
    const env = new MathEnv(duo, { kind: "sequential" });
    await env.reset(problems[2]!, 0);
    await env.act("reasoner", "expand");
    const last = env.act("actor", "\\boxed{x^2+2x+1-x^2-2x}");
    expect(env.ready()).toEqual([]);
    expect(env.terminated).toBe(false);
    await last;
    expect(env.terminated).toBe(true);
    expect(env.outcome().correct).toBe(true);
  });
});

describe("createMathSuite on the shared datasets", () => {
  it("GSM8K with the last 500 rows held out", () => {
    const suite = createMathSuite({
      trainFile: join(DATA, "gsm8k/train.jsonl"),
      evalSplit: 500,
      extract: "last-number",
    });
    expect(suite.name).toBe("math");
    expect(suite.train.length).toBe(7473 - 500);
    expect(suite.eval.length).toBe(500);
    expect(suite.taskId(suite.eval[0]!)).toBe("gsm8k/train.jsonl#6973");
    const trainIds = new Set(suite.train.map((p) => p.id));
    expect(suite.eval.some((p) => trainIds.has(p.id))).toBe(false);
  });

  it("MATH train with MATH-500 as the eval file", () => {
    const suite = createMathSuite({
      trainFile: join(DATA, "math/train.json"),
      evalFile: join(DATA, "math/test500.jsonl"),
      limit: 50,
      evalLimit: 20,
    });
    expect(suite.train.length).toBe(50);
    expect(suite.eval.length).toBe(20);
  });
});

describe("parseMathOptions", () => {
  it("accepts the math options and names a bad field", () => {
    expect(parseMathOptions({ extract: "last-number", cutAfter: 2 })).toEqual({
      extract: "last-number",
      cutAfter: 2,
    });
    expect(parseMathOptions(undefined)).toEqual({});
    expect(parseMathOptions({ stepRoles: ["stepper"] })).toEqual({ stepRoles: ["stepper"] });
    expect(() => parseMathOptions({ extract: "first" })).toThrow(/^task\.options\.extract: /);
    expect(() => parseMathOptions({ bogus: 1 })).toThrow(/^task\.options: .*bogus/);
  });
});
