// The team's dependency graph D_t, drawn: agents in layers (an agent right of every agent it sees),
// an arrow from each agent to the agents that see its action. Static graphs come from config.yaml;
// a dynamic graph has no static edges, so it shows the edges the transcripts observed, with counts.
import type { AgentView, GraphView, ObservedEdge } from "../api.ts";
import { colorOf, h, svg } from "./dom.ts";

interface Edge {
  from: string;
  to: string;
  /** From the config (solid) or only seen in transcripts (dashed). */
  configured: boolean;
  count?: number;
}

/** Layer of each agent: the longest chain of agents it sees (edges that would close a cycle are ignored). */
function layers(agents: string[], edges: Edge[]): Map<string, number> {
  const layer = new Map<string, number>();
  const visiting = new Set<string>();
  const depth = (a: string): number => {
    const known = layer.get(a);
    if (known !== undefined) return known;
    if (visiting.has(a)) return 0;
    visiting.add(a);
    const d = Math.max(-1, ...edges.filter((e) => e.to === a && e.from !== a).map((e) => depth(e.from))) + 1;
    visiting.delete(a);
    layer.set(a, d);
    return d;
  };
  for (const a of agents) depth(a);
  return layer;
}

export function graphView(agents: AgentView[], graph: GraphView, observed: ObservedEdge[]): HTMLElement {
  const ids = agents.map((a) => a.id);
  const edges: Edge[] = graph.edges.map(([from, to]) => ({ from, to, configured: true }));
  for (const o of observed) {
    const e = edges.find((x) => x.from === o.from && x.to === o.to);
    if (e) e.count = o.count;
    else if (ids.includes(o.from) && ids.includes(o.to)) edges.push({ ...o, configured: false });
  }
  const layer = layers(ids, edges);
  const columns = new Map<number, string[]>();
  for (const a of ids) columns.set(layer.get(a)!, [...(columns.get(layer.get(a)!) ?? []), a]);
  const W = 130;
  const H = 40;
  const gapX = 70;
  const gapY = 22;
  const rows = Math.max(...[...columns.values()].map((c) => c.length));
  const width = columns.size * W + (columns.size - 1) * gapX + 20;
  const height = rows * H + (rows - 1) * gapY + 20;
  const pos = new Map<string, { x: number; y: number }>();
  for (const [col, members] of columns) {
    const top = (height - (members.length * H + (members.length - 1) * gapY)) / 2;
    members.forEach((a, i) => {
      pos.set(a, { x: 10 + col * (W + gapX), y: top + i * (H + gapY) });
    });
  }

  const marker = svg(
    "marker",
    {
      id: "arrow",
      viewBox: "0 0 10 10",
      refX: 9,
      refY: 5,
      markerWidth: 7,
      markerHeight: 7,
      orient: "auto-start-reverse",
    },
    svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#555" }),
  );
  const drawn = edges.map((e) => {
    const a = pos.get(e.from)!;
    const b = pos.get(e.to)!;
    const forward = b.x > a.x;
    // forward edges leave the right side; edges within a column (or backwards) bend around the left
    const [x1, y1] = forward ? [a.x + W, a.y + H / 2] : [a.x, a.y + H / 2];
    const [x2, y2] = forward ? [b.x, b.y + H / 2] : [b.x, b.y + H / 2];
    const bend = forward ? (x2 - x1) / 2 : -40;
    const d = `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - (forward ? bend : -bend)} ${y2}, ${x2} ${y2}`;
    const g = svg(
      "g",
      { class: "edge", "data-from": e.from, "data-to": e.to },
      svg("path", {
        d,
        fill: "none",
        stroke: "#555",
        "stroke-width": 1.5,
        "stroke-dasharray": e.configured ? "" : "5 4",
        "marker-end": "url(#arrow)",
      }),
    );
    if (e.count !== undefined && graph.kind === "dynamic") {
      const t = svg("text", {
        x: (x1 + x2) / 2,
        y: (y1 + y2) / 2 - 5,
        "text-anchor": "middle",
        class: "edge-count",
      });
      t.textContent = `×${e.count}`;
      g.append(t);
    }
    return g;
  });
  const nodes = agents.map((a, i) => {
    const p = pos.get(a.id)!;
    const label = svg("text", {
      x: p.x + W / 2,
      y: p.y + (a.role === a.id ? H / 2 + 5 : H / 2 - 2),
      "text-anchor": "middle",
      class: "node-id",
    });
    label.textContent = a.id;
    const g = svg(
      "g",
      { class: "node", "data-agent": a.id },
      svg("rect", {
        x: p.x,
        y: p.y,
        width: W,
        height: H,
        rx: 8,
        fill: "#fff",
        stroke: colorOf(i),
        "stroke-width": 2.5,
      }),
      label,
    );
    if (a.role !== a.id) {
      const role = svg("text", {
        x: p.x + W / 2,
        y: p.y + H / 2 + 13,
        "text-anchor": "middle",
        class: "node-role",
      });
      role.textContent = a.role + (a.trainable ? "" : " (frozen)");
      g.append(role);
    } else if (!a.trainable) label.textContent = `${a.id} (frozen)`;
    return g;
  });
  const caption =
    graph.kind === "dynamic"
      ? observed.length
        ? "dynamic graph: the edges the sampled transcripts observed (× actions)"
        : "dynamic graph: who sees whom is decided at run time; no transcripts yet"
      : `${graph.kind} graph${edges.some((e) => !e.configured) ? " (dashed: seen in transcripts only)" : ""}`;
  return h(
    "figure",
    { class: "graph", "data-kind": graph.kind },
    svg(
      "svg",
      { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" },
      svg("defs", {}, marker),
      ...drawn,
      ...nodes,
    ),
    h("figcaption", {}, caption),
  );
}
