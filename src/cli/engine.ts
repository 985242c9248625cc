// `marft engine serve [--host H] [--port P] [--device D]`: run the Python compute engine in the
// foreground (e.g. on a GPU server) and print the URL and token a trainer needs to reach it.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { engineAllocatorEnv } from "../client/launcher.ts";
import { parseCommand } from "./args.ts";

const USAGE = `usage: marft engine serve [--host 127.0.0.1] [--port 8765] [--device auto|cpu|cuda] [--max-batch N]
                          [--checkpoint-root DIR]

Runs the compute engine in the foreground. The bearer token is taken from MARFT_ENGINE_TOKEN, or a
random one is made and printed. Checkpoints are read and written only inside --checkpoint-root
(default: ./runs). Point a trainer at it with
  marft train CONFIG --engine-url URL --engine-token-env MARFT_ENGINE_TOKEN
`;

export const REPO_ROOT = fileURLToPath(new URL("../../", import.meta.url));

export function enginePython(): string {
  const py = `${REPO_ROOT}.venv/bin/python`;
  return existsSync(py) ? py : "python3";
}

export async function engineCommand(args: string[]): Promise<void> {
  const [sub, ...rest] = args;
  if (sub === "--help" || sub === "-h") {
    process.stdout.write(USAGE);
    return;
  }
  if (sub !== "serve") {
    process.stderr.write(sub === undefined ? USAGE : `marft engine: unknown subcommand "${sub}"\n\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  const values = parseCommand("engine serve", USAGE, rest, {
    host: { type: "string" },
    port: { type: "string" },
    device: { type: "string" },
    "max-batch": { type: "string" },
    "checkpoint-root": { type: "string" },
  })?.values;
  if (!values) return;
  const device = values.device ?? "auto";
  if (!["auto", "cpu", "cuda"].includes(device)) {
    process.stderr.write(`marft engine serve: --device: expected auto, cpu or cuda, got "${device}"\n`);
    process.exitCode = 2;
    return;
  }
  const token = process.env["MARFT_ENGINE_TOKEN"] || randomBytes(24).toString("hex");
  const pyArgs = [
    "-m",
    "marft_engine.server",
    "--host",
    values.host ?? "127.0.0.1",
    "--port",
    values.port ?? "8765",
    "--device",
    device,
    "--checkpoint-root",
    resolve(values["checkpoint-root"] ?? "runs"),
  ];
  if (values["max-batch"]) pyArgs.push("--max-batch", values["max-batch"]);
  const child = spawn(enginePython(), pyArgs, {
    cwd: `${REPO_ROOT}engine`,
    env: { ...process.env, ...engineAllocatorEnv(), MARFT_ENGINE_TOKEN: token },
    stdio: ["ignore", "pipe", "inherit"],
  });
  let buffer = "";
  child.stdout.setEncoding("utf8");
  child.stdout.on("data", (chunk: string) => {
    buffer += chunk;
    let nl = buffer.indexOf("\n");
    while (nl >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      nl = buffer.indexOf("\n");
      let ready: { event?: string; url?: string } | undefined;
      try {
        ready = JSON.parse(line) as { event?: string; url?: string };
      } catch {
        ready = undefined;
      }
      if (ready?.event === "ready" && ready.url) {
        const own = !process.env["MARFT_ENGINE_TOKEN"];
        process.stdout.write(
          `engine ready\n  url:   ${ready.url}\n  token: ${own ? token : "(from MARFT_ENGINE_TOKEN)"}\n` +
            `train against it: MARFT_ENGINE_TOKEN=... marft train CONFIG --engine-url ${ready.url}\n`,
        );
      } else {
        process.stdout.write(`${line}\n`);
      }
    }
  });
  const forward = (sig: NodeJS.Signals) => () => child.kill(sig);
  process.on("SIGINT", forward("SIGINT"));
  process.on("SIGTERM", forward("SIGTERM"));
  const code = await new Promise<number>((res) => child.on("exit", (c, s) => res(c ?? (s ? 1 : 0))));
  process.exitCode = code;
}
