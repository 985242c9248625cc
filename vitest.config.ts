import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["tests/**/*.test.ts"],
    testTimeout: 120_000,
    hookTimeout: 180_000,
    // Integration tests start real engines; two cores cannot run many at once.
    maxWorkers: 2,
  },
});
