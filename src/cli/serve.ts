// `marft serve <config | run dir | checkpoint> [--host H] [--port P] [--token T] [--engine-url URL]`:
// the team of a config behind the OpenAI-compatible gateway (src/gateway), on a local engine it
// starts or a running one. Given a run directory (its latest checkpoint) or a checkpoint directory,
// it serves the trained adapters.
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { appRunConfig, connector } from "../app/train-app.ts";
import type { RunConfig } from "../config/schema.ts";
import { MarftError } from "../errors.ts";
import { gatewayAgents } from "../gateway/agents.ts";
import { Gateway } from "../gateway/server.ts";
import type { EngineHandle } from "../train/run.ts";
import { RunDir } from "../train/rundir.ts";
import { setupEngine } from "../train/setup.ts";
import { parseCommand } from "./args.ts";
import { reportError } from "./train.ts";

const USAGE = `usage: marft serve <config.yaml | runs/<name> | runs/<name>/checkpoints/iter_N> [options]

Serves the team of a run config as an OpenAI-compatible API: GET /v1/models lists the agents,
POST /v1/chat/completions takes an agent id as \`model\`. A run directory serves its latest
checkpoint's adapters, a checkpoint directory that checkpoint's. Requests with the header
x-marft-episode: <id> are recorded (GET /v1/episodes/<id>).

options:
  --host H                 address to listen on (default 127.0.0.1: loopback only)
  --port P                 port (default 8080; 0 = any free port)
  --token T                bearer token clients must send (default $MARFT_GATEWAY_TOKEN, else a new one)
  --engine-url URL         use a running engine instead of starting one
  --engine-token-env VAR   environment variable with that engine's token (default MARFT_ENGINE_TOKEN)
  --set path=value         override a config field (repeatable)
  --max-body-mb N          largest request body (default 16)
`;

interface Target {
  config: RunConfig;
  /** The checkpoint whose adapters are served, if any. */
  checkpoint?: string;
}

/** What the positional names: a config file, a run directory or a checkpoint directory. */
export function resolveServeTarget(path: string, sets: string[]): Target {
  if (!existsSync(path)) throw new MarftError(`${path} does not exist`);
  if (!statSync(path).isDirectory()) return { config: appRunConfig(path, sets, true).config };
  const dir = resolve(path);
  if (existsSync(join(dir, "config.yaml"))) {
    const latest = new RunDir(dir).latestCheckpoint();
    return {
      config: appRunConfig(join(dir, "config.yaml"), sets, true).config,
      ...(latest ? { checkpoint: latest.path } : {}),
    };
  }
  const runDir = dirname(dirname(dir));
  if (/^iter_\d+$/.test(basename(dir)) && existsSync(join(runDir, "config.yaml"))) {
    if (!existsSync(join(dir, "engine")))
      throw new MarftError(`${path}: not a complete checkpoint (no engine/)`);
    return { config: appRunConfig(join(runDir, "config.yaml"), sets, true).config, checkpoint: dir };
  }
  throw new MarftError(
    `${path}: expected a config file, a run directory (with config.yaml) or a checkpoint (iter_N)`,
  );
}

export async function serveCommand(args: string[]): Promise<void> {
  const parsed = parseCommand(
    "serve",
    USAGE,
    args,
    {
      host: { type: "string" },
      port: { type: "string" },
      token: { type: "string" },
      "engine-url": { type: "string" },
      "engine-token-env": { type: "string" },
      set: { type: "string", multiple: true },
      "max-body-mb": { type: "string" },
    },
    { positionals: "expected one config, run directory or checkpoint" },
  );
  if (!parsed) return;
  const { values, positionals } = parsed;
  const port = Number(values.port ?? "8080");
  const maxMb = Number(values["max-body-mb"] ?? "16");
  if (!Number.isInteger(port) || port < 0 || port > 65535 || !(maxMb > 0)) {
    process.stderr.write(
      `marft serve: --port: expected 0-65535; --max-body-mb: expected a positive number\n`,
    );
    process.exitCode = 2;
    return;
  }
  let handle: EngineHandle | undefined;
  let gateway: Gateway | undefined;
  try {
    const { config, checkpoint } = resolveServeTarget(positionals[0]!, values.set ?? []);
    const tokenFrom = values.token
      ? "--token"
      : process.env["MARFT_GATEWAY_TOKEN"]
        ? "MARFT_GATEWAY_TOKEN"
        : null;
    const token = values.token || process.env["MARFT_GATEWAY_TOKEN"] || randomBytes(24).toString("base64url");
    const logFile = join(mkdtempSync(join(tmpdir(), "marft-serve-")), "engine.log");
    const remote = values["engine-url"];
    const engineToken = process.env[values["engine-token-env"] ?? config.engine.tokenEnv];
    if (remote && !engineToken)
      throw new MarftError(
        `--engine-url: set ${values["engine-token-env"] ?? config.engine.tokenEnv} to that engine's token`,
      );
    handle = await connector(config, logFile, remote ? { url: remote, token: engineToken! } : undefined)();
    await setupEngine(handle.client, config);
    if (checkpoint) await handle.client.loadCheckpoint({ path: join(checkpoint, "engine") });
    gateway = new Gateway({
      engine: handle.client,
      agents: gatewayAgents(config),
      token,
      maxBodyBytes: Math.round(maxMb * 1024 * 1024),
      log: (line) => process.stderr.write(`${line}\n`),
    });
    const url = await gateway.listen(port, values.host ?? "127.0.0.1");
    process.stdout.write(
      [
        "marft gateway ready",
        `  base URL: ${url}`,
        `  token:    ${tokenFrom ? `(from ${tokenFrom})` : token}`,
        `  agents:   ${config.agents.map((a) => a.id).join(", ")}`,
        `  adapters: ${checkpoint ?? "fresh (untrained)"}`,
        remote ? `  engine:   ${remote}` : `  engine:   local, log ${logFile}`,
        "",
      ].join("\n"),
    );
    const g = gateway;
    const h = handle;
    await new Promise<void>((done) => {
      const stop = () => done();
      process.once("SIGINT", stop);
      process.once("SIGTERM", stop);
    });
    await g.close();
    await h.stop();
  } catch (e) {
    await gateway?.close().catch(() => {});
    await handle?.stop().catch(() => {});
    reportError("serve", e);
  }
}
