// A dependency-free progress bar for terminals, plain lines for logs and pipes.
// On a TTY the bar redraws in place; elsewhere a line is printed at most every `plainEveryMs` and at
// the end, so CI logs stay short, and also when nothing has changed for that long (a heartbeat): a
// long phase that reports no progress (an evaluation, a slow update) still shows the job is alive.

export interface ProgressOptions {
  stream?: NodeJS.WriteStream | { write(s: string): unknown; isTTY?: boolean; columns?: number };
  /** Plain-line mode: at most one line per this many ms, and at least one (default 15 s). */
  plainEveryMs?: number;
  /** Print nothing at all (e.g. --quiet). */
  silent?: boolean;
}

const SPIN = ["|", "/", "-", "\\"];

export class Progress {
  private done = 0;
  private extra = "";
  private readonly start = Date.now();
  private lastPlain = 0;
  private spin = 0;
  private finished = false;
  private readonly stream: NonNullable<ProgressOptions["stream"]>;
  private readonly tty: boolean;
  private readonly every: number;
  private heartbeat: ReturnType<typeof setInterval> | undefined;

  constructor(
    readonly label: string,
    /** 0 or less: unknown total (spinner). */
    private total: number,
    private readonly opts: ProgressOptions = {},
  ) {
    this.stream = opts.stream ?? process.stderr;
    this.tty = Boolean(this.stream.isTTY);
    this.every = opts.plainEveryMs ?? 15_000;
    if (!this.tty && !opts.silent) {
      this.heartbeat = setInterval(() => this.render(false), Math.max(1, Math.floor(this.every / 4)));
      this.heartbeat.unref?.(); // a bar never keeps the process alive
    }
  }

  /** Set the absolute count (and an optional short status such as "reward 0.42"). */
  update(done: number, extra?: string, total?: number): void {
    this.done = done;
    if (extra !== undefined) this.extra = extra;
    if (total !== undefined) this.total = total;
    this.render(false);
  }

  tick(n = 1, extra?: string): void {
    this.update(this.done + n, extra);
  }

  /** Finish the bar with a final line. */
  finish(extra?: string): void {
    if (this.finished) return;
    if (extra !== undefined) this.extra = extra;
    this.finished = true;
    clearInterval(this.heartbeat);
    this.render(true);
  }

  private line(): string {
    const secs = (Date.now() - this.start) / 1000;
    const time = `${secs.toFixed(1)}s`;
    const extra = this.extra ? `  ${this.extra}` : "";
    if (this.total <= 0) {
      const s = this.finished ? "done" : SPIN[this.spin++ % SPIN.length];
      return `${this.label} ${s} ${this.done}  ${time}${extra}`;
    }
    const frac = Math.min(1, this.done / this.total);
    const width = 24;
    const full = Math.round(frac * width);
    const bar = `${"#".repeat(full)}${".".repeat(width - full)}`;
    return `${this.label} [${bar}] ${this.done}/${this.total}  ${time}${extra}`;
  }

  private render(final: boolean): void {
    if (this.opts.silent) return;
    if (this.tty) {
      const cols = (this.stream as { columns?: number }).columns ?? 100;
      this.stream.write(`\r\x1b[2K${this.line().slice(0, cols - 1)}${final ? "\n" : ""}`);
      return;
    }
    const now = Date.now();
    if (final || now - this.lastPlain >= this.every) {
      this.lastPlain = now;
      this.stream.write(`${this.line()}\n`);
    }
  }
}

/** A fixed-width text table for summaries. */
export function table(rows: Array<Array<string | number>>, header?: string[]): string {
  const all = header ? [header, ...rows] : rows;
  const cells = all.map((r) => r.map((c) => (typeof c === "number" ? formatNumber(c) : c)));
  const widths: number[] = [];
  for (const r of cells) {
    r.forEach((c, i) => {
      widths[i] = Math.max(widths[i] ?? 0, c.length);
    });
  }
  const fmt = (r: string[]) =>
    r
      .map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)))
      .join("  ")
      .trimEnd();
  const lines = cells.map(fmt);
  if (header) lines.splice(1, 0, widths.map((w) => "-".repeat(w)).join("  "));
  return `${lines.join("\n")}\n`;
}

export function formatNumber(x: number): string {
  if (!Number.isFinite(x)) return String(x);
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(2);
  return x.toFixed(a < 1 ? 4 : 3);
}
