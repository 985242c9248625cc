// TensorBoard event files: the bytes match what TensorBoard's own protos and record writer produce
// for the same events (tests/fixtures/tensorboard/make_fixture.py wrote the reference), and the
// writer frames every record so that it reads back.
import { mkdtempSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadRunConfig } from "../src/config/load.ts";
import { RunDir } from "../src/train/rundir.ts";
import { encodeEvent, maskedCrc32c, TensorBoardWriter, tfRecord } from "../src/train/tensorboard.ts";
import { WatchFiles } from "../src/train/watch.ts";

const REFERENCE = join(import.meta.dirname, "fixtures", "tensorboard", "reference.tfevents");

/** The records of a TFRecord file, each checked against its two CRCs. */
function records(bytes: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0; at < bytes.length; ) {
    const header = bytes.subarray(at, at + 8);
    const n = Number(header.readBigUInt64LE());
    expect(bytes.readUInt32LE(at + 8)).toBe(maskedCrc32c(header));
    const data = bytes.subarray(at + 12, at + 12 + n);
    expect(bytes.readUInt32LE(at + 12 + n)).toBe(maskedCrc32c(data));
    out.push(data);
    at += 16 + n;
  }
  return out;
}

describe("TensorBoard event files", () => {
  it("encode events byte for byte as TensorBoard's writer does", () => {
    const ours = Buffer.concat([
      tfRecord(encodeEvent({ wallTime: 1700000000.25, step: 0, fileVersion: "brain.Event:2" })),
      tfRecord(
        encodeEvent({
          wallTime: 1700000001.5,
          step: 1,
          scalars: { "reward/mean": 0.375, "kl/speaker": 0.0041862408 },
        }),
      ),
      tfRecord(encodeEvent({ wallTime: 1700000002.75, step: 3, sessionStart: true })),
    ]);
    expect(ours.toString("hex")).toBe(readFileSync(REFERENCE).toString("hex"));
  });

  it("the masked CRC32C of the standard check input", () => {
    // CRC32C("123456789") = 0xE3069283; masked: rotate right 15, add 0xA282EAD8
    const crc = 0xe3069283;
    expect(maskedCrc32c(Buffer.from("123456789"))).toBe((((crc >>> 15) | (crc << 17)) + 0xa282ead8) >>> 0);
  });

  it("a writer appends a file version, then one record per row and per restart", () => {
    const dir = mkdtempSync(join(tmpdir(), "marft-tb-"));
    const w = new TensorBoardWriter(dir);
    w.scalars(1, { iteration: 1, "reward/mean": 0.5, "value/explained_variance": Number.NaN });
    w.sessionStart(2);
    w.scalars(2, { iteration: 2, "reward/mean": 0.75 });
    const files = readdirSync(dir);
    expect(files).toHaveLength(1);
    expect(files[0]).toMatch(/^events\.out\.tfevents\.\d+\./);
    const recs = records(readFileSync(join(dir, files[0]!)));
    expect(recs).toHaveLength(4);
    expect(recs[0]!.toString("latin1")).toContain("brain.Event:2");
    // the NaN is left out, the iteration counter is the step, not a scalar
    expect(recs[1]!.toString("latin1")).toContain("reward/mean");
    expect(recs[1]!.toString("latin1")).not.toContain("explained_variance");
    expect(recs[1]!.toString("latin1")).not.toContain("iteration");
    // a second writer starts its own file
    new TensorBoardWriter(dir);
    expect(readdirSync(dir)).toHaveLength(2);
  });

  it("train.tensorboard: a run's rows go to runs/<name>/tensorboard, a rewind marks the restart", () => {
    const config = join(import.meta.dirname, "..", "configs", "tiny-secret.yaml");
    const run = new RunDir(mkdtempSync(join(tmpdir(), "marft-tb-run-")));
    new WatchFiles(run, loadRunConfig(config, ["train.tensorboard=false"])).iteration(
      1,
      { "reward/mean": 1 },
      undefined,
    );
    expect(() => readdirSync(run.tensorboardDir)).toThrow(/ENOENT/);

    const watch = new WatchFiles(run, loadRunConfig(config, ["train.tensorboard=true"]));
    watch.rewind(2);
    watch.iteration(3, { "reward/mean": 0.5 }, undefined);
    const [file] = readdirSync(run.tensorboardDir);
    const recs = records(readFileSync(join(run.tensorboardDir, file!)));
    expect(recs).toHaveLength(3); // file version, session start, the row
    // step 3 (field 2 = 0x10), session_log (field 7 = 0x3a) { status: START (field 1 = 0x08, 1) }
    expect(recs[1]!.toString("hex")).toMatch(/1003(3a020801)$/);
    expect(recs[2]!.toString("hex")).toContain("1003");
    expect(recs[2]!.toString("latin1")).toContain("reward/mean");
  });
});
