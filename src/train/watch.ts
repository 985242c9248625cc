// What a run writes for the people watching it, besides metrics.jsonl: transcripts.jsonl (a sample of
// each iteration's episodes with per-token credit, `train.transcripts`) and TensorBoard event files
// (`train.tensorboard`). train() (run.ts) calls it after each metrics line and when it rewinds to a
// checkpoint, so both stay in step with metrics.jsonl across resumes and engine restarts.
import type { RunConfig } from "../config/schema.ts";
import type { MetricsRow } from "./phases.ts";
import type { RunDir } from "./rundir.ts";
import { TensorBoardWriter } from "./tensorboard.ts";
import { type TrainedBatch, transcriptRecords } from "./transcripts.ts";

export class WatchFiles {
  private tensorboard: TensorBoardWriter | undefined;

  constructor(
    private readonly run: RunDir,
    private readonly config: RunConfig,
  ) {}

  /** After iteration `iteration`'s metrics line: its transcripts and its scalars. */
  iteration(iteration: number, row: MetricsRow, batch: TrainedBatch | undefined): void {
    const c = this.config;
    if (c.train.transcripts > 0 && batch) {
      this.run.appendTranscripts(transcriptRecords(c, iteration, batch));
    }
    if (c.train.tensorboard) this.writer().scalars(iteration, row);
  }

  /** The run continues after iteration `iteration` (a checkpoint's, or 0): later records are dropped. */
  rewind(iteration: number): void {
    this.run.truncateTranscripts(iteration);
    if (this.config.train.tensorboard) this.writer().sessionStart(iteration + 1);
  }

  private writer(): TensorBoardWriter {
    this.tensorboard ??= new TensorBoardWriter(this.run.tensorboardDir);
    return this.tensorboard;
  }
}
