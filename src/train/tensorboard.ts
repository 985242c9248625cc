// TensorBoard event files (`train.tensorboard: true`): each metrics row as scalar summaries under
// runs/<name>/tensorboard/, for people who keep their curves in TensorBoard.
//
// No maintained npm package writes event files without a native build (@tensorflow/tfjs-node downloads
// the TensorFlow C library at install time), so this writes the format itself: TFRecord framing
// (length, masked CRC32C of it, data, masked CRC32C of the data) around `tensorflow.Event` protos,
// encoded by protobufjs from the few message definitions below (field numbers of TensorFlow's
// event.proto and summary.proto). tests/tensorboard.test.ts checks the bytes against a file written
// by TensorBoard's own writer.
import { crc32c } from "@aws-crypto/crc32c";
import { appendFileSync, existsSync, mkdirSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import protobuf from "protobufjs";

const root = protobuf.Root.fromJSON({
  nested: {
    tensorflow: {
      nested: {
        Event: {
          oneofs: { what: { oneof: ["fileVersion", "summary", "sessionLog"] } },
          fields: {
            wallTime: { type: "double", id: 1 },
            step: { type: "int64", id: 2 },
            fileVersion: { type: "string", id: 3 },
            summary: { type: "Summary", id: 5 },
            sessionLog: { type: "SessionLog", id: 7 },
          },
        },
        Summary: {
          fields: { value: { rule: "repeated", type: "Value", id: 1 } },
          nested: {
            Value: { fields: { tag: { type: "string", id: 1 }, simpleValue: { type: "float", id: 2 } } },
          },
        },
        SessionLog: {
          fields: { status: { type: "SessionStatus", id: 1 } },
          nested: { SessionStatus: { values: { STATUS_UNSPECIFIED: 0, START: 1, STOP: 2, CHECKPOINT: 3 } } },
        },
      },
    },
  },
});
const EventType = root.lookupType("tensorflow.Event");
const SESSION_START = 1;

export interface TensorBoardEvent {
  wallTime: number;
  step: number;
  fileVersion?: string;
  scalars?: Record<string, number>;
  /** A session (re)start at `step`: readers drop the events of this run at that step and later. */
  sessionStart?: boolean;
}

/** The serialized `tensorflow.Event`. */
export function encodeEvent(e: TensorBoardEvent): Uint8Array {
  const msg: Record<string, unknown> = { wallTime: e.wallTime, step: e.step };
  if (e.fileVersion !== undefined) msg["fileVersion"] = e.fileVersion;
  else if (e.scalars !== undefined)
    msg["summary"] = { value: Object.entries(e.scalars).map(([tag, simpleValue]) => ({ tag, simpleValue })) };
  else if (e.sessionStart) msg["sessionLog"] = { status: SESSION_START };
  return EventType.encode(EventType.fromObject(msg)).finish();
}

/** TensorFlow's masked CRC32C: the CRC rotated right by 15 bits plus a constant, mod 2^32. */
export function maskedCrc32c(data: Uint8Array): number {
  const crc = crc32c(data) >>> 0;
  return (((crc >>> 15) | (crc << 17)) + 0xa282ead8) >>> 0;
}

/** One TFRecord: uint64 length, uint32 masked CRC of the length bytes, the data, uint32 masked CRC of it. */
export function tfRecord(data: Uint8Array): Buffer {
  const header = Buffer.alloc(8);
  header.writeBigUInt64LE(BigInt(data.length));
  const crcs = Buffer.alloc(8);
  crcs.writeUInt32LE(maskedCrc32c(header), 0);
  crcs.writeUInt32LE(maskedCrc32c(data), 4);
  return Buffer.concat([header, crcs.subarray(0, 4), data, crcs.subarray(4)]);
}

/** Appends events to one events.out.tfevents.* file in `dir`; a new writer starts a new file. */
export class TensorBoardWriter {
  readonly path: string;

  constructor(dir: string) {
    mkdirSync(dir, { recursive: true });
    const base = `events.out.tfevents.${Math.floor(Date.now() / 1000)}.${hostname()}.${process.pid}`;
    let path = join(dir, base);
    for (let n = 1; existsSync(path); n++) path = join(dir, `${base}.${n}`);
    this.path = path;
    this.write({ wallTime: Date.now() / 1000, step: 0, fileVersion: "brain.Event:2" });
  }

  /** A metrics row as scalars at `step`; values that are not finite numbers are left out. */
  scalars(step: number, row: Readonly<Record<string, unknown>>): void {
    const scalars: Record<string, number> = {};
    for (const [k, v] of Object.entries(row)) {
      if (k !== "iteration" && typeof v === "number" && Number.isFinite(v)) scalars[k] = v;
    }
    this.write({ wallTime: Date.now() / 1000, step, scalars });
  }

  /** A resume from `step - 1`: TensorBoard then drops what an earlier session wrote at `step` and later. */
  sessionStart(step: number): void {
    this.write({ wallTime: Date.now() / 1000, step, sessionStart: true });
  }

  private write(e: TensorBoardEvent): void {
    appendFileSync(this.path, tfRecord(encodeEvent(e)));
  }
}
