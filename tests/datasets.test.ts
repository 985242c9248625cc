import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import {
  datasetsDir,
  findDatasetsDir,
  holdOutLast,
  loadRecords,
  parseJsonRecords,
  readJsonRecords,
} from "../src/envs/datasets.ts";

const dir = mkdtempSync(join(tmpdir(), "marft-datasets-"));
function file(name: string, text: string): string {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
}
const Row = z.object({ problem: z.string(), answer: z.string() });

describe("readJsonRecords", () => {
  it("reads JSONL with the line of each record, skipping blank lines", () => {
    const f = file("a.jsonl", '{"x":1}\n\n{"x":2}\n');
    expect(readJsonRecords(f)).toEqual([
      { line: 1, value: { x: 1 } },
      { line: 3, value: { x: 2 } },
    ]);
  });

  it("reads a pretty-printed JSON array with the line where each element starts", () => {
    const text = JSON.stringify([{ a: "[,{" }, { b: [1, 2] }, 3], null, 2);
    const recs = parseJsonRecords(text, "x.json");
    expect(recs.map((r) => r.value)).toEqual([{ a: "[,{" }, { b: [1, 2] }, 3]);
    const lines = text.split("\n");
    for (const r of recs) expect(lines[r.line - 1]!.trim()[0]).toMatch(/[{3]/);
    expect(recs.map((r) => r.line)).toEqual([2, 5, 11]);
  });

  it("names the file and the line of invalid JSON", () => {
    const f = file("bad.jsonl", '{"x":1}\n{"x":\n');
    expect(() => readJsonRecords(f)).toThrow(`${f}:2: invalid JSON`);
    const g = file("bad.json", '[\n {"x": 1},\n {"x": }\n]');
    expect(() => readJsonRecords(g)).toThrow(new RegExp(`${g}:3: invalid JSON`));
  });

  it("names a file that cannot be read", () => {
    expect(() => readJsonRecords(join(dir, "nope.jsonl"))).toThrow(/nope\.jsonl: cannot read/);
  });
});

describe("loadRecords", () => {
  it("validates records and reports a missing field with file and line", () => {
    const f = file("m.jsonl", '{"problem":"p","answer":"1"}\n{"problem":"q"}\n');
    expect(() => loadRecords(f, Row)).toThrow(`${f}:2: missing field "answer"`);
  });

  it("reports a field of the wrong type and a record that is not an object", () => {
    const f = file("t.jsonl", '{"problem":"p","answer":3}\n');
    expect(() => loadRecords(f, Row)).toThrow(`${f}:1: field "answer": expected string, got number`);
    const g = file("n.json", '[{"problem":"p","answer":"1"},\n 7]');
    expect(() => loadRecords(g, Row)).toThrow(`${g}:2: expected a JSON object, got number`);
  });

  it("returns the parsed records with their lines", () => {
    const f = file("ok.json", '[\n{"problem":"p","answer":"1","extra":true}\n]');
    expect(loadRecords(f, Row)).toEqual([{ line: 2, record: { problem: "p", answer: "1" } }]);
  });
});

describe("holdOutLast", () => {
  it("holds out the last rows deterministically", () => {
    expect(holdOutLast([1, 2, 3, 4], 1)).toEqual({ train: [1, 2, 3], dev: [4] });
    expect(holdOutLast([1, 2], 5)).toEqual({ train: [], dev: [1, 2] });
    expect(() => holdOutLast([1], -1)).toThrow(/devSize/);
  });
});

describe("datasetsDir", () => {
  it("finds the shared datasets; MARFT_DATASETS overrides, and a wrong one is named", () => {
    expect(existsSync(join(datasetsDir(), "gsm8k/train.jsonl"))).toBe(true);
    const before = process.env["MARFT_DATASETS"];
    try {
      process.env["MARFT_DATASETS"] = dir;
      expect(findDatasetsDir()).toBe(dir);
      process.env["MARFT_DATASETS"] = join(dir, "nope");
      expect(() => findDatasetsDir()).toThrow(/^MARFT_DATASETS: .*nope does not exist/);
    } finally {
      if (before === undefined) delete process.env["MARFT_DATASETS"];
      else process.env["MARFT_DATASETS"] = before;
    }
  });
});
