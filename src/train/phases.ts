// One helper both times a phase of an iteration (`time/<phase>` in the metrics) and reports it as
// progress (for the bars and log lines of the CLI).
import type { EvalResult } from "./evaluate.ts";

export type MetricsRow = Record<string, number>;

export type ProgressEvent =
  | { kind: "phase"; iteration: number; phase: string; done?: number; total?: number }
  | { kind: "iteration"; iteration: number; total: number; row: MetricsRow }
  | { kind: "eval"; iteration: number; result: EvalResult };

export class Phases {
  /** Seconds per phase, as metrics columns: time/<phase>. */
  readonly times: MetricsRow = {};

  constructor(
    private readonly iteration: number,
    private readonly onProgress: (e: ProgressEvent) => void,
  ) {}

  /**
   * Runs `fn` as phase `name` (times add up when a phase runs several times, e.g. one policy update
   * per adapter); `label` is what progress shows (default: the name). `fn` may report its own
   * progress (done of total).
   */
  async run<T>(
    name: string,
    fn: (progress: (done: number, total: number) => void) => Promise<T>,
    label = name,
  ): Promise<T> {
    const report = (done?: number, total?: number) =>
      this.onProgress({ kind: "phase", iteration: this.iteration, phase: label, done, total });
    report();
    const t0 = performance.now();
    try {
      return await fn((done, total) => report(done, total));
    } finally {
      const key = `time/${name}`;
      this.times[key] = (this.times[key] ?? 0) + (performance.now() - t0) / 1000;
    }
  }
}
