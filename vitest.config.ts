import type { TestSpecification } from "vitest/node";
import { BaseSequencer } from "vitest/node";
import { defineConfig } from "vitest/config";

// The files that take minutes (learning runs, kill-and-resume, real bases), longest first. Vitest
// starts the longest files first only when its cache holds their durations from an earlier run; a
// clean clone (CI) has none, so it goes by file size, and a slow file started last leaves one of the
// two workers idle for minutes. Measured per file: docs/MEASUREMENTS.md, "`make test` on a fresh clone".
const SLOW_FIRST = [
  "e2e.test.ts",
  "replicas.test.ts",
  "resume.test.ts",
  "app-e2e.test.ts",
  "cli.test.ts",
  "hetero.test.ts",
  "train.test.ts",
  "async-engine.test.ts",
  "golden.test.ts",
  "compare-resume.test.ts",
  "flow-resume.test.ts",
  "liveness.test.ts",
  "package.test.ts",
  "app.test.ts",
];

class SlowFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const rest = await super.sort(files);
    const rank = (f: TestSpecification) => {
      const i = SLOW_FIRST.findIndex((name) => f.moduleId.endsWith(`/tests/${name}`));
      return i < 0 ? SLOW_FIRST.length : i;
    };
    // a stable sort: the listed files in the list's order, then the rest in vitest's own order
    return rest.map((f, i) => ({ f, i })).sort((a, b) => rank(a.f) - rank(b.f) || a.i - b.i).map((x) => x.f);
  }
}

export default defineConfig({
  test: {
    include: ["tests/**/*.test.ts"],
    testTimeout: 120_000,
    hookTimeout: 180_000,
    // Integration tests start real engines; two cores cannot run many at once.
    maxWorkers: 2,
    sequence: { sequencer: SlowFirst },
  },
});
