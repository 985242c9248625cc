// The `marft` command: a thin dispatcher; each subcommand lives in its own module.
const USAGE = `usage: marft <command> [options]

commands:
  train <config> [--resume DIR] [--set k=v ...]   train a team
  train-app <config> --app FILE                   train the agents of an unmodified app (via the gateway)
  serve <config|run dir|checkpoint>               the team as an OpenAI-compatible API
  eval <config|run dir> --data FILE [--n N]       evaluate a team
  demo                                            the main job: train a real two-agent team
  dashboard [runs/] [--port P] [--host H]         watch runs in a browser while they train
  compare <spec.yaml> [--out DIR]                 variants x seeds at one budget, compared
  bench                                           speed and memory figures
  engine serve [--host H] [--port P]              run the compute engine
  grade math                                      JSONL {pred, gold} on stdin -> verdicts
  setup [--venv DIR]                              install the Python engine (for an installed package)
  sandbox run --lang python --timeout S FILE      run one program in the sandbox
`;

export async function main(argv: string[]): Promise<void> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case "train":
      return (await import("./train.ts")).trainCommand(rest);
    case "train-app":
      return (await import("./train-app.ts")).trainAppCommand(rest);
    case "serve":
      return (await import("./serve.ts")).serveCommand(rest);
    case "eval":
      return (await import("./eval.ts")).evalCommand(rest);
    case "demo":
      return (await import("./demo.ts")).demoCommand(rest);
    case "dashboard":
      return (await import("./dashboard.ts")).dashboardCommand(rest);
    case "compare":
      return (await import("./compare.ts")).compareCommand(rest);
    case "bench":
      return (await import("./bench.ts")).benchCommand(rest);
    case "engine":
      return (await import("./engine.ts")).engineCommand(rest);
    case "grade":
      return (await import("./grade.ts")).gradeCommand(rest);
    case "setup":
      return (await import("./setup.ts")).setupCommand(rest);
    case "sandbox":
      return (await import("./sandbox.ts")).sandboxCommand(rest);
    case undefined:
    case "-h":
    case "--help":
    case "help":
      process.stdout.write(USAGE);
      return;
    default:
      process.stderr.write(`marft: unknown command "${cmd}"\n\n${USAGE}`);
      process.exitCode = 2;
  }
}
