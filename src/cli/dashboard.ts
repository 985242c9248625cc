// `marft dashboard [runs/] [--port P] [--host H]`: a local web page that lists the runs (and
// `marft compare` results) in a folder and shows each run while it trains.
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { startDashboard } from "../dashboard/server.ts";
import { parseCommand, usageError } from "./args.ts";

const USAGE = `usage: marft dashboard [runs/] [options]

Serves a page with every run below the folder (default: runs): reward and per-agent curves, the
team's dependency graph, transcripts coloured by advantage, compare results. It updates live.

options:
  --port P   port to listen on (default 6007; 0: any free port)
  --host H   address to bind (default 127.0.0.1: this machine only; 0.0.0.0 serves the network)

Every request needs the token in the printed URL (the page keeps it in a cookie); set
MARFT_DASHBOARD_TOKEN to choose it.
`;

const LOOPBACK = new Set(["127.0.0.1", "localhost", "::1"]);

export async function dashboardCommand(args: string[]): Promise<void> {
  const parsed = parseCommand(
    "dashboard",
    USAGE,
    args,
    { port: { type: "string" }, host: { type: "string" } },
    { positionals: ({ positionals }) => (positionals.length > 1 ? "expected one runs folder" : undefined) },
  );
  if (!parsed) return;
  const { values, positionals } = parsed;
  const port = Number(values.port ?? 6007);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    return usageError("dashboard", USAGE, `--port: expected 0..65535, got "${values.port}"`);
  const root = resolve(positionals[0] ?? "runs");
  const host = values.host ?? "127.0.0.1";
  let dash: Awaited<ReturnType<typeof startDashboard>>;
  try {
    dash = await startDashboard({
      root,
      host,
      port,
      token: process.env["MARFT_DASHBOARD_TOKEN"] || undefined,
    });
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    const why =
      err.code === "EADDRINUSE" ? `port ${port} is in use; choose another with --port` : err.message;
    process.stderr.write(`marft dashboard: ${why}\n`);
    process.exitCode = 1;
    return;
  }
  if (!existsSync(root))
    process.stderr.write(`marft dashboard: ${root} does not exist yet; runs appear when it does\n`);
  if (!LOOPBACK.has(host)) {
    process.stderr.write(
      `marft dashboard: serving on ${host}: anyone who can reach it and has the token sees the runs\n`,
    );
  }
  process.stdout.write(`marft dashboard: ${root}\n${dash.url}\n`);
  const stop = () => {
    void dash.close().then(() => process.exit(0));
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}
