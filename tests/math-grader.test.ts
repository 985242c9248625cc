import { readFileSync } from "node:fs";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { gradeAnswer } from "../src/envs/math/grader.ts";
import { closeSharedSymbolicPool, SymbolicPool } from "../src/envs/math/pool.ts";
import { GRADER_TABLE } from "./fixtures/math/grader-table.ts";

afterAll(() => closeSharedSymbolicPool());

describe("gradeAnswer: table of real MATH answer forms", () => {
  it("has at least 150 pairs, both equal and not equal", () => {
    expect(GRADER_TABLE.length).toBeGreaterThanOrEqual(150);
    expect(GRADER_TABLE.filter((r) => r[2]).length).toBeGreaterThan(60);
    expect(GRADER_TABLE.filter((r) => !r[2]).length).toBeGreaterThan(60);
  });

  it("gives the expected verdict on every pair", async () => {
    const got = await Promise.all(GRADER_TABLE.map(([p, g]) => gradeAnswer(p, g)));
    const wrong = GRADER_TABLE.map((row, k) => ({ row, r: got[k]! })).filter(
      ({ row, r }) => r.equal !== row[2],
    );
    expect(
      wrong.map(
        ({ row, r }) => `${JSON.stringify(row)} -> ${r.predNormalized} | ${r.goldNormalized} (${r.reason})`,
      ),
    ).toEqual([]);
  });

  it("is symmetric on the table", async () => {
    const got = await Promise.all(GRADER_TABLE.map(([p, g]) => gradeAnswer(g, p)));
    const wrong = GRADER_TABLE.filter((row, k) => got[k]!.equal !== row[2]);
    expect(wrong).toEqual([]);
  });
});
