// What the dashboard's server sends its page (and report.html embeds): plain JSON shapes, shared by
// the server (src/dashboard/*.ts) and the browser code (src/dashboard/client/), so no imports here.

/** One metrics.jsonl line; NaN was written as null. */
export type MetricsRow = Record<string, number | null>;

export type RunState = "running" | "finished" | "stopped";

export interface RunListItem {
  /** Path below the runs folder, "/"-separated (e.g. "tiny" or "compare/spec/a-seed0"). */
  name: string;
  agents: string[];
  estimator: string;
  /** Metrics lines so far, and the iterations the config asks for. */
  iterations: number;
  totalIterations: number | null;
  /** running: no summary.json newer than the last metrics line; finished / stopped: summary.json says. */
  state: RunState;
  /** When a file of the run last changed (ms since the epoch). */
  updated: number;
  lastReward: number | null;
  /** Why part of the run could not be read (names the file); the rest is still shown. */
  error?: string;
}

export interface CompareListItem {
  /** Path of the folder holding compare.json, below the runs folder. */
  name: string;
  variants: string[];
}

export interface RunsList {
  root: string;
  runs: RunListItem[];
  compares: CompareListItem[];
}

export interface AgentView {
  id: string;
  role: string;
  trainable: boolean;
}

export interface GraphView {
  kind: string;
  /** [from, to]: `to` sees `from` (static graphs; none for parallel and dynamic ones). */
  edges: Array<[string, string]>;
}

/** An edge seen in the transcripts' `parents`, and in how many actions. */
export interface ObservedEdge {
  from: string;
  to: string;
  count: number;
}

export interface EpisodeSummary {
  episode: number;
  taskId: string;
  teamReward: number;
  correct: boolean;
}

export interface TranscriptIteration {
  iteration: number;
  episodes: EpisodeSummary[];
}

export interface EvalView {
  iteration: number;
  accuracy: number;
  ci95: [number, number];
  n: number;
}

export interface RunData {
  name: string;
  agents: AgentView[];
  graph: GraphView;
  estimator: string;
  totalIterations: number | null;
  /** ppo.klCoef: KL to the reference is measured only when it is positive. */
  klCoef: number;
  state: RunState;
  updated: number;
  /** Lines in metrics.jsonl; `rows` holds those from `from` on. */
  total: number;
  from: number;
  rows: MetricsRow[];
  eval: { before?: EvalView; after?: EvalView };
  transcripts: TranscriptIteration[];
  observedEdges: ObservedEdge[];
  error?: string;
}

export interface TranscriptTurn {
  agent: string;
  role: string;
  step: number;
  order: number;
  parents: string[];
  adapterVersion: number;
  trained: boolean;
  text: string;
  finishReason: string;
  reward: number;
  tokenIds: number[];
  logprobs: number[];
  advantages: number[];
}

export interface TranscriptRecord {
  iteration: number;
  episode: number;
  group: number;
  taskId: string;
  task: string;
  level: "action" | "token";
  outcome: { correct: boolean; score: number; teamReward: number; roleRewards: Record<string, number> };
  terminated: boolean;
  truncated: boolean;
  info: Record<string, unknown>;
  turns: TranscriptTurn[];
}

export interface CompareSeed {
  seed: number;
  accuracy: number;
  ci95: [number, number];
  sampled_tokens: number;
  wall_s: number;
}

export interface CompareVariant {
  name: string;
  seeds: CompareSeed[];
  /** null while no seed of the variant has finished (a partial report). */
  mean: number | null;
  ci95: [number, number] | null;
  vs_first?: { diff: number; ci95: [number, number]; paired_p: number } | null;
}

export interface CompareData {
  name: string;
  variants: CompareVariant[];
}

/** A bar with its 95% interval (compare results, a report's accuracies). */
export interface Bar {
  name: string;
  value: number;
  ci95: [number, number];
  /** Individual measurements drawn over the bar (e.g. one per seed). */
  points?: number[];
}

/** What a report adds to the runs' views (the demo: its accuracies, summary and eval transcripts). */
export interface ReportExtras {
  title: string;
  summary: Array<[string, string]>;
  bars?: { title: string; bars: Bar[] };
  /** Held-out problems side by side, e.g. before and after training. */
  comparison?: {
    title: string;
    columns: string[];
    rows: Array<Array<{ messages: Array<{ role: string; content: string }>; correct: boolean }>>;
  };
}

/** report.html: everything the page shows, embedded. */
export interface StaticData {
  generated: string;
  list: RunsList;
  runs: Record<string, RunData>;
  transcripts: Record<string, Record<number, TranscriptRecord[]>>;
  compares: Record<string, CompareData>;
  extras?: ReportExtras;
  /** Runs drawn together on the charts when the report opens (the first is the main one). */
  overlay?: string[];
  /** Iterations whose transcripts were left out to keep the file small. */
  transcriptsOmitted?: number;
}
