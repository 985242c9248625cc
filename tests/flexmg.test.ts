import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { checkEnv } from "../src/flexmg/check.ts";
import { buildGraph, type Edge, findCycle, topologicalOrder } from "../src/flexmg/graph.ts";
import { TeamEpisode } from "../src/flexmg/team.ts";
import type { AgentId, AgentSpec, ChatMessage, Env, Outcome, Rewards } from "../src/flexmg/types.ts";

const names = (n: number) => Array.from({ length: n }, (_, i) => `a${i}`);
const specs = (ids: string[]): AgentSpec[] =>
  ids.map((id) => ({ id, role: `R${id}`, systemPrompt: `you are ${id}` }));

/** Random DAG: edges only from lower to higher index of a random permutation. */
const dagArb = fc.integer({ min: 1, max: 8 }).chain((n) =>
  fc.record({
    agents: fc.constant(names(n)),
    perm: fc.shuffledSubarray(names(n), { minLength: n, maxLength: n }),
    pairs: fc.array(fc.tuple(fc.nat(n - 1), fc.nat(n - 1)), { maxLength: 20 }),
  }),
);

describe("graph", () => {
  it("sequential: agent i's parents are exactly agents 0..i-1", () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 10 }), (n) => {
        const g = buildGraph(names(n), { kind: "sequential" });
        names(n).forEach((a, i) => {
          expect(g.parents(a)).toEqual(names(n).slice(0, i));
        });
        expect(g.order).toEqual(names(n));
      }),
    );
  });

  it("parallel: nobody has parents", () => {
    const g = buildGraph(names(4), { kind: "parallel" });
    for (const a of names(4)) expect(g.parents(a)).toEqual([]);
  });

  it("random DAGs are never rejected and every topological order respects the edges", () => {
    fc.assert(
      fc.property(dagArb, ({ agents, perm, pairs }) => {
        const edges: Edge[] = pairs.filter(([i, j]) => i < j).map(([i, j]) => [perm[i]!, perm[j]!] as Edge);
        const g = buildGraph(agents, { kind: "edges", edges });
        const pos = new Map(g.order.map((a, i) => [a, i]));
        expect(g.order.length).toBe(agents.length);
        expect(new Set(g.order).size).toBe(agents.length);
        for (const [from, to] of edges) {
          expect(pos.get(from)!).toBeLessThan(pos.get(to)!);
          expect(g.parents(to)).toContain(from);
          expect(g.children(from)).toContain(to);
        }
      }),
    );
  });

  it("random graphs with a cycle are always rejected, naming a real cycle", () => {
    fc.assert(
      fc.property(dagArb, fc.integer({ min: 2, max: 5 }), ({ agents, perm, pairs }, len) => {
        const n = agents.length;
        fc.pre(n >= 2);
        const k = Math.min(len, n);
        const cycle = perm.slice(0, k);
        const edges: Edge[] = pairs.map(([i, j]) => [perm[i]!, perm[j]!] as Edge).filter(([a, b]) => a !== b);
        for (let i = 0; i < k; i++) edges.push([cycle[i]!, cycle[(i + 1) % k]!]);
        expect(() => buildGraph(agents, { kind: "edges", edges })).toThrow(/agents: the graph has a cycle/);
        const found = findCycle(agents, edges)!;
        expect(found[0]).toBe(found[found.length - 1]);
        for (let i = 0; i + 1 < found.length; i++) {
          expect(edges.some(([a, b]) => a === found[i] && b === found[i + 1])).toBe(true);
        }
      }),
    );
  });

  it("names the cycle and unknown agents in the error", () => {
    expect(() =>
      buildGraph(["a", "b"], {
        kind: "edges",
        edges: [
          ["a", "b"],
          ["b", "a"],
        ],
      }),
    ).toThrow("agents: the graph has a cycle a -> b -> a");
    expect(() => buildGraph(["a", "b"], { kind: "edges", edges: [["a", "c"]] })).toThrow(
      'graph.edges[0]: unknown agent "c"',
    );
    expect(() => buildGraph(["a", "a"], { kind: "parallel" })).toThrow('duplicate agent id "a"');
    expect(() => topologicalOrder(["x"], [["x", "x"]])).toThrow("x -> x");
  });
});

describe("TeamEpisode", () => {
  it("sequential: one agent ready at a time, observations carry the task, history and parents' actions", () => {
    const team = new TeamEpisode(specs(["r", "a"]), { kind: "sequential" });
    team.reset("what is 2+2?");
    expect(team.ready()).toEqual(["r"]);
    expect(() => team.observe("a")).toThrow('observe: agent "a" is not ready: waiting for r');
    expect(team.observe("r")).toEqual([
      { role: "system", content: "you are r" },
      { role: "user", content: "what is 2+2?" },
    ]);
    team.record("r", "add them");
    expect(team.ready()).toEqual(["a"]);
    expect(team.parents("a")).toEqual(["r"]);
    expect(team.observe("a")[1]!.content).toBe("what is 2+2?\n\nRr: add them");
    expect(() => team.record("r", "again")).toThrow("already acted");
    team.record("a", "5");
    expect(team.stepComplete()).toBe(true);
    expect(team.ready()).toEqual([]);
    team.addHistory("attempt 1: wrong");
    team.nextStep();
    expect(team.step).toBe(1);
    expect(team.ready()).toEqual(["r"]);
    expect(team.observe("r")[1]!.content).toBe("what is 2+2?\n\nattempt 1: wrong");
    team.record("r", "x");
    team.record("a", "4");
    team.finish();
    expect(team.ready()).toEqual([]);
    expect(() => team.observe("r")).toThrow("the episode is over");
    expect(team.transcript().map((m) => m.content)).toEqual([
      "what is 2+2?",
      "Rr: add them",
      "Ra: 5",
      "attempt 1: wrong",
      "Rr: x",
      "Ra: 4",
    ]);
  });

  it("edges: siblings are ready together and the child waits for both", () => {
    const team = new TeamEpisode(specs(["s1", "s2", "agg"]), {
      kind: "edges",
      edges: [
        ["s1", "agg"],
        ["s2", "agg"],
      ],
    });
    team.reset({ s1: "x", s2: "y", agg: "z" });
    expect(team.ready()).toEqual(["s1", "s2"]);
    team.record("s2", "B");
    expect(team.ready()).toEqual(["s1"]);
    team.record("s1", "A");
    expect(team.observe("agg")[1]!.content).toBe("z\n\nRs1: A\nRs2: B");
    expect(() => team.reset({ s1: "x" })).toThrow('task: no text for agent "s2"');
  });

  it("dynamic: nobody acts until scheduled; scheduled agents see whom they were told to", () => {
    const team = new TeamEpisode(specs(["o", "w1", "w2"]), { kind: "dynamic" });
    team.reset("go");
    expect(team.ready()).toEqual([]);
    team.schedule("o");
    expect(team.ready()).toEqual(["o"]);
    expect(() => team.schedule("w1", ["w2"])).toThrow("not scheduled in this step");
    team.schedule("w2", ["o"]);
    expect(team.ready()).toEqual(["o"]);
    team.record("o", "w2 please");
    expect(team.stepComplete()).toBe(false);
    expect(team.ready()).toEqual(["w2"]);
    expect(team.parents("w2")).toEqual(["o"]);
    team.record("w2", "done");
    expect(team.stepComplete()).toBe(true);
    expect(() => team.schedule("w2")).toThrow("already scheduled");
    const stat = new TeamEpisode(specs(["a"]), { kind: "parallel" });
    expect(() => stat.schedule("a")).toThrow("only dynamic graphs");
  });
});

/** A deliberately broken env for checkEnv to catch: ready() lists an agent that observe refuses, etc. */
class BrokenEnv implements Env<number> {
  readonly agents = ["a", "b"];
  private n = 0;
  private r: Rewards = {};
  terminated = false;
  truncated = false;
  async reset(_task: number, seed: number) {
    this.n = 0;
    this.terminated = false;
    this.r = {};
    this.seedUsed = seed;
  }
  seedUsed = 0;
  ready(): AgentId[] {
    return this.terminated ? [] : ["a"];
  }
  observe(_agent: AgentId): ChatMessage[] {
    // Bug: never refuses non-ready agents; non-deterministic content.
    return [{ role: "user", content: String(Math.random()) }];
  }
  parents(): AgentId[] {
    return [];
  }
  step() {
    return 0;
  }
  async act(agent: AgentId) {
    this.n++;
    this.r[agent] = Number.NaN;
    if (this.n >= 3) {
      this.terminated = true;
      this.truncated = true;
    }
  }
  takeRewards() {
    const r = this.r;
    this.r = {};
    return r;
  }
  state(): ChatMessage[] {
    return [{ role: "user", content: "same" }];
  }
  outcome(): Outcome {
    // Bug: valid before the end, and a score outside [0, 1].
    return { correct: true, score: 2, teamReward: 1, roleRewards: {} };
  }
  info() {
    return {};
  }
}

describe("checkEnv", () => {
  it("reports the problems of a broken env", async () => {
    const problems = await checkEnv(() => new BrokenEnv(), [0], { seeds: [0] });
    const text = problems.join("\n");
    expect(text).toContain('observe("b") for a non-ready agent did not throw');
    expect(text).toContain('act("b") for a non-ready agent did not throw');
    expect(text).toContain("is not finite");
    expect(text).toContain("state() did not grow");
    expect(text).toContain("both terminated and truncated");
    expect(text).toContain("outcome().score is not a number in [0, 1]");
    expect(text).toContain("outcome() before the episode ended did not throw");
    expect(text).toContain("not deterministic");
  });

  it("finds an env that never ends", async () => {
    class Endless extends BrokenEnv {
      override async act() {}
    }
    const problems = await checkEnv(() => new Endless(), [0], { seeds: [0], maxActions: 5 });
    expect(problems.join("\n")).toContain("did not end within 5 actions");
  });
});
