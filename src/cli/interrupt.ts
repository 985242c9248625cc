// Ctrl-C (SIGINT) and SIGTERM during a training run: the first finishes the iteration, saves a
// checkpoint and says so; a second one quits at once.
//
// One keypress often arrives twice: `make` and `npx` run the CLI in the terminal's foreground process
// group, so it gets the terminal's SIGINT, and npm also forwards the SIGINT it got itself. A second
// signal within DEBOUNCE_MS of the first is that echo, not a second Ctrl-C.
const DEBOUNCE_MS = 1000;

export interface Interrupt {
  /** Aborted at the first Ctrl-C / SIGTERM: the trainer checkpoints after the current iteration. */
  signal: AbortSignal;
  /** Remove the handlers (the run is over). */
  dispose(): void;
}

export function onInterrupt(write: (text: string) => void = (t) => process.stderr.write(t)): Interrupt {
  const abort = new AbortController();
  let first = 0;
  const handler = (sig: NodeJS.Signals) => {
    const now = performance.now();
    if (!abort.signal.aborted) {
      first = now;
      const what = sig === "SIGINT" ? "Ctrl-C" : sig;
      write(`\n${what}: finishing this iteration, then saving a checkpoint (Ctrl-C again to quit now)\n`);
      abort.abort();
      return;
    }
    if (now - first < DEBOUNCE_MS) return;
    write("\nsecond Ctrl-C: quitting now, without a checkpoint of this iteration\n");
    process.exit(130);
  };
  process.on("SIGINT", handler);
  process.on("SIGTERM", handler);
  return {
    signal: abort.signal,
    dispose: () => {
      process.off("SIGINT", handler);
      process.off("SIGTERM", handler);
    },
  };
}
