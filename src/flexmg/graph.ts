// Dependency graphs D_t over the agents acting in one step (DESIGN §3). Pure: no I/O.
//
// An edge [from, to] means "to sees from": to's observation contains from's action of the same step,
// so from must act first. A static graph (sequential, parallel, edges) is the same in every step;
// a dynamic graph has no static edges: the environment schedules agents at run time (see team.ts).
import type { AgentId, GraphSpec } from "./types.ts";

export type Edge = [from: AgentId, to: AgentId];

export interface DependencyGraph {
  kind: GraphSpec["kind"];
  /** All agents, in profile order. */
  agents: readonly AgentId[];
  /** Static edges ("to sees from"); empty for parallel and dynamic graphs. */
  edges: readonly Edge[];
  /** A topological order of the agents (ties broken by profile order). */
  order: readonly AgentId[];
  /** The agents whose actions `agent` sees within a step, in profile order. */
  parents(agent: AgentId): AgentId[];
  children(agent: AgentId): AgentId[];
}

/** The static edges a GraphSpec describes over `agents` (profile order matters for `sequential`). */
export function edgesOf(agents: readonly AgentId[], spec: GraphSpec): Edge[] {
  switch (spec.kind) {
    case "sequential": {
      // Agent i sees every earlier agent 1..i-1 (the MARFT reference), not only agent i-1.
      const edges: Edge[] = [];
      for (let i = 0; i < agents.length; i++) {
        for (let j = 0; j < i; j++) edges.push([agents[j]!, agents[i]!]);
      }
      return edges;
    }
    case "parallel":
    case "dynamic":
      return [];
    case "edges":
      return spec.edges.map(([from, to]) => [from, to]);
  }
}

/**
 * A cycle in the graph as a closed walk [a, b, ..., a], or null when the graph is acyclic.
 * Depth-first search in profile order, so the cycle reported is deterministic.
 */
export function findCycle(agents: readonly AgentId[], edges: readonly Edge[]): AgentId[] | null {
  const out = new Map<AgentId, AgentId[]>(agents.map((a) => [a, []]));
  for (const [from, to] of edges) out.get(from)?.push(to);
  const state = new Map<AgentId, "open" | "done">();
  const stack: AgentId[] = [];
  const visit = (a: AgentId): AgentId[] | null => {
    state.set(a, "open");
    stack.push(a);
    for (const b of out.get(a) ?? []) {
      const s = state.get(b);
      if (s === "open") return [...stack.slice(stack.indexOf(b)), b];
      if (s === undefined) {
        const cycle = visit(b);
        if (cycle) return cycle;
      }
    }
    stack.pop();
    state.set(a, "done");
    return null;
  };
  for (const a of agents) {
    if (!state.has(a)) {
      const cycle = visit(a);
      if (cycle) return cycle;
    }
  }
  return null;
}

/**
 * Kahn's algorithm; among the agents that are free at a time the earliest in profile order goes
 * first, so the order is deterministic. Throws on a cycle, naming it.
 */
export function topologicalOrder(agents: readonly AgentId[], edges: readonly Edge[]): AgentId[] {
  const cycle = findCycle(agents, edges);
  if (cycle) throw new Error(`agents: the graph has a cycle ${cycle.join(" -> ")}`);
  const indegree = new Map<AgentId, number>(agents.map((a) => [a, 0]));
  for (const [, to] of edges) indegree.set(to, (indegree.get(to) ?? 0) + 1);
  const order: AgentId[] = [];
  const placed = new Set<AgentId>();
  while (order.length < agents.length) {
    const next = agents.find((a) => !placed.has(a) && indegree.get(a) === 0);
    if (next === undefined) throw new Error("agents: the graph has a cycle"); // unreachable after findCycle
    order.push(next);
    placed.add(next);
    for (const [from, to] of edges) if (from === next) indegree.set(to, (indegree.get(to) ?? 0) - 1);
  }
  return order;
}

/** Validates a GraphSpec over the team and precomputes parents and a topological order. */
export function buildGraph(agents: readonly AgentId[], spec: GraphSpec): DependencyGraph {
  if (agents.length === 0) throw new Error("agents: the team is empty");
  const seen = new Set<AgentId>();
  for (const a of agents) {
    if (seen.has(a)) throw new Error(`agents: duplicate agent id "${a}"`);
    seen.add(a);
  }
  const edges = edgesOf(agents, spec);
  edges.forEach(([from, to], i) => {
    for (const name of [from, to]) {
      if (!seen.has(name)) {
        throw new Error(
          `graph.edges[${i}]: unknown agent "${name}" (the agents are ${agents.map((a) => `"${a}"`).join(", ")})`,
        );
      }
    }
    if (from === to) throw new Error(`agents: the graph has a cycle ${from} -> ${to}`);
  });
  // Duplicate edges are harmless but would double-count in-degrees; keep the first.
  const unique: Edge[] = [];
  const keys = new Set<string>();
  for (const e of edges) {
    const key = JSON.stringify(e);
    if (!keys.has(key)) {
      keys.add(key);
      unique.push(e);
    }
  }
  const order = topologicalOrder(agents, unique);
  const rank = new Map(agents.map((a, i) => [a, i]));
  const byProfile = (xs: AgentId[]) => xs.sort((a, b) => rank.get(a)! - rank.get(b)!);
  const parentsOf = new Map<AgentId, AgentId[]>(agents.map((a) => [a, []]));
  const childrenOf = new Map<AgentId, AgentId[]>(agents.map((a) => [a, []]));
  for (const [from, to] of unique) {
    parentsOf.get(to)!.push(from);
    childrenOf.get(from)!.push(to);
  }
  for (const a of agents) {
    byProfile(parentsOf.get(a)!);
    byProfile(childrenOf.get(a)!);
  }
  const known = (agent: AgentId) => {
    if (!seen.has(agent)) throw new Error(`unknown agent "${agent}"`);
  };
  return {
    kind: spec.kind,
    agents: [...agents],
    edges: unique,
    order,
    parents(agent) {
      known(agent);
      return [...parentsOf.get(agent)!];
    },
    children(agent) {
      known(agent);
      return [...childrenOf.get(agent)!];
    },
  };
}
