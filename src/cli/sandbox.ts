// `marft sandbox run --lang python --timeout SECONDS [--memory MB] [--stdin FILE] FILE`:
// runs one program in the sandbox and prints one JSON result, for people who debug code rewards.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { runSandboxed } from "../envs/code/sandbox.ts";

const USAGE = `usage: marft sandbox run --lang python --timeout SECONDS [--memory MB] [--stdin FILE] FILE

Runs FILE (or "-" for standard input) in the sandbox and prints
{"status", "exit_code", "stdout", "stderr", "wall_ms", "truncated", "isolation", "memory_mode",
"memory_peak_bytes"} as JSON. --memory bounds the program and all its children together.
status: ok | error | timeout | memory | output_limit | killed
`;

export async function sandboxCommand(args: string[]): Promise<void> {
  const [sub, ...rest] = args;
  if (sub === undefined || sub === "-h" || sub === "--help") {
    process.stdout.write(USAGE);
    return;
  }
  if (sub !== "run") return usageError(`unknown subcommand "${sub}"`);
  if (rest.includes("--help") || rest.includes("-h")) {
    process.stdout.write(USAGE);
    return;
  }
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(rest);
  } catch (e) {
    return usageError((e as Error).message);
  }
  const { values, positionals } = parsed;
  if (positionals.length !== 1) return usageError("expected exactly one FILE");
  if (values.lang !== "python") return usageError(`--lang: only "python" is supported, got "${values.lang}"`);
  const timeout = Number(values.timeout);
  if (!(timeout > 0))
    return usageError(`--timeout: expected a positive number of seconds, got "${values.timeout}"`);
  const memory = Number(values.memory);
  if (!(memory >= 32)) return usageError(`--memory: expected megabytes >= 32, got "${values.memory}"`);
  const file = positionals[0]!;
  let code: string;
  let stdin: string | undefined;
  try {
    code = readFileSync(file === "-" ? 0 : file, "utf8");
    if (values.stdin !== undefined) stdin = readFileSync(values.stdin, "utf8");
  } catch (e) {
    process.stderr.write(`marft sandbox: ${(e as Error).message}\n`);
    process.exitCode = 1;
    return;
  }
  const r = await runSandboxed({ lang: "python", code, stdin, timeoutMs: timeout * 1000, memoryMb: memory });
  const out = {
    status: r.status,
    exit_code: r.exitCode,
    stdout: r.stdout,
    stderr: r.stderr,
    wall_ms: r.wallMs,
    truncated: r.truncated,
    isolation: r.isolation,
    memory_mode: r.memoryMode,
    memory_peak_bytes: r.memoryPeakBytes,
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

function parse(args: string[]) {
  return parseArgs({
    args,
    allowPositionals: true,
    options: {
      lang: { type: "string", default: "python" },
      timeout: { type: "string", default: "10" },
      memory: { type: "string", default: "512" },
      stdin: { type: "string" },
    },
  });
}

function usageError(msg: string): void {
  process.stderr.write(`marft sandbox: ${msg}\n\n${USAGE}`);
  process.exitCode = 2;
}
