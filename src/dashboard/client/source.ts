// Where the page's data comes from: the dashboard server (live, with change events) or the data
// embedded in report.html (static). The views see only this interface.
import type { CompareData, RunData, RunsList, StaticData, TranscriptRecord } from "../api.ts";

export type Change = { kind: "runs" } | { kind: "run"; name: string };

export interface Source {
  readonly live: boolean;
  list(): Promise<RunsList>;
  /** The run's data with the metrics rows from `from` on. */
  run(name: string, from?: number): Promise<RunData>;
  transcripts(name: string, iteration: number): Promise<TranscriptRecord[]>;
  compare(name: string): Promise<CompareData>;
  /** Calls `fn` on every change the server reports; `status` on connection changes. */
  watch(fn: (c: Change) => void, status: (connected: boolean) => void): void;
}

async function getJson<T>(path: string): Promise<T> {
  const r = await fetch(path, { credentials: "same-origin" });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.text()).trim()}`);
  return (await r.json()) as T;
}

const q = encodeURIComponent;

export class HttpSource implements Source {
  readonly live = true;
  list = () => getJson<RunsList>("/api/runs");
  run = (name: string, from = 0) => getJson<RunData>(`/api/run?name=${q(name)}&from=${from}`);
  transcripts = (name: string, iteration: number) =>
    getJson<TranscriptRecord[]>(`/api/transcripts?name=${q(name)}&iteration=${iteration}`);
  compare = (name: string) => getJson<CompareData>(`/api/compare?name=${q(name)}`);

  watch(fn: (c: Change) => void, status: (connected: boolean) => void): void {
    const es = new EventSource("/api/events");
    es.onopen = () => status(true);
    es.onerror = () => status(false);
    es.addEventListener("runs", () => fn({ kind: "runs" }));
    es.addEventListener("run", (e) =>
      fn({ kind: "run", name: (JSON.parse((e as MessageEvent).data) as { name: string }).name }),
    );
  }
}

export class StaticSource implements Source {
  readonly live = false;
  constructor(readonly data: StaticData) {}
  list = async () => this.data.list;
  run = async (name: string) => {
    const r = this.data.runs[name];
    if (!r) throw new Error(`no run "${name}" in this report`);
    return r;
  };
  transcripts = async (name: string, iteration: number) => this.data.transcripts[name]?.[iteration] ?? [];
  compare = async (name: string) => {
    const c = this.data.compares[name];
    if (!c) throw new Error(`no compare result "${name}" in this report`);
    return c;
  };
  watch(): void {}
}
