// Ctrl-C during a run: the first one asks for a checkpoint and says so once; the echo of the same
// keypress (make / npx forward the SIGINT the CLI already got) is ignored; a real second one quits.
import { afterEach, describe, expect, it, vi } from "vitest";
import { onInterrupt } from "../src/cli/interrupt.ts";

describe("onInterrupt", () => {
  afterEach(() => vi.restoreAllMocks());

  it("one Ctrl-C delivered twice is one; a later second one quits with 130", async () => {
    const lines: string[] = [];
    const exit = vi.spyOn(process, "exit").mockImplementation((() => undefined) as never);
    const i = onInterrupt((t) => lines.push(t));
    try {
      process.emit("SIGINT", "SIGINT");
      process.emit("SIGINT", "SIGINT"); // npm's forwarded copy, milliseconds later
      expect(i.signal.aborted).toBe(true);
      expect(lines).toEqual([
        "\nCtrl-C: finishing this iteration, then saving a checkpoint (Ctrl-C again to quit now)\n",
      ]);
      expect(exit).not.toHaveBeenCalled();
      await new Promise((r) => setTimeout(r, 1100));
      process.emit("SIGINT", "SIGINT");
      expect(exit).toHaveBeenCalledWith(130);
      expect(lines[1]).toContain("second Ctrl-C: quitting now");
    } finally {
      i.dispose();
    }
  });

  it("SIGTERM asks for the same checkpoint, naming the signal", () => {
    const lines: string[] = [];
    const i = onInterrupt((t) => lines.push(t));
    try {
      process.emit("SIGTERM", "SIGTERM");
      expect(i.signal.aborted).toBe(true);
      expect(lines).toEqual([
        "\nSIGTERM: finishing this iteration, then saving a checkpoint (Ctrl-C again to quit now)\n",
      ]);
    } finally {
      i.dispose();
    }
  });
});
