// MARFT as an installable library: `npm pack` (which builds dist/ first) gives a package that
// installs into an empty Node 20 project, where `npx marft --help` runs from the compiled JavaScript
// (no tsx: it is a devDependency), `import { trainApp, TeamEnv, checkEnv, ... } from "marft"`
// type-checks against the declarations, and the same import works at run time.
// npm installs the package's dependencies from its cache (`--prefer-offline`): `make setup`'s
// `npm ci` has put them there.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = join(import.meta.dirname, "..");
const dir = mkdtempSync(join(tmpdir(), "marft-package-"));
const project = join(dir, "project");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const CONSUMER_TS = `import {
  type AppContext,
  type AppRun,
  checkEnv,
  EPISODE_HEADER,
  type Env,
  Gateway,
  loadRunConfig,
  type Outcome,
  type RunConfig,
  TeamEnv,
  trainApp,
} from "marft";

interface Task { id: string; question: string }

// an app's run, as trainApp takes it
const run: AppRun<Task> = async (task: Task, ctx: AppContext) => {
  const headers: Record<string, string> = ctx.headers;
  void headers[EPISODE_HEADER];
  return task.question.length > 0 ? { teamReward: 1, roleRewards: { solver: 0.5 } } : 0;
};

// an environment, as a task family writes it
class Echo extends TeamEnv<string> {
  async reset(task: string, _seed: number): Promise<void> {
    this.begin({ a: task });
  }
  async act(agent: string, text: string): Promise<void> {
    this.team.record(agent, text);
    const o: Outcome = { correct: true, score: 1, teamReward: 1, roleRewards: {} };
    this.end(o);
  }
}

export async function main(config: RunConfig): Promise<void> {
  const env: Env<string> = new Echo([{ id: "a", role: "a", systemPrompt: "" }], { kind: "sequential" });
  await checkEnv(() => env, ["t"]);
  await trainApp({ config, tasks: [{ id: "1", question: "?" }], run });
  const g = new Gateway({ engine: null, agents: [], token: "t" });
  void g;
  void loadRunConfig;
}
`;

// at run time: the compiled package answers as a gateway, with no engine and no Python
const CONSUMER_MJS = `import { Gateway } from "marft";
const g = new Gateway({
  engine: null,
  token: "tok",
  agents: [{ id: "solver", adapter: "solver", base: "b", sampling: { temperature: 1, topP: 1, topK: 0, maxNewTokens: 8, stop: [] } }],
});
const url = await g.listen();
const models = await (await fetch(url + "/models", { headers: { authorization: "Bearer tok" } })).json();
const denied = await fetch(url + "/models");
const noEngine = await fetch(url + "/chat/completions", {
  method: "POST",
  headers: { authorization: "Bearer tok", "content-type": "application/json" },
  body: JSON.stringify({ model: "solver", messages: [{ role: "user", content: "hi" }] }),
});
console.log(JSON.stringify({ models: models.data.map((m) => m.id), denied: denied.status, noEngine: noEngine.status }));
await g.close();
`;

/** Runs a command; a failure's error carries what it printed (tsc writes its errors to stdout). */
function run(cmd: string, args: string[], cwd: string): string {
  try {
    return execFileSync(cmd, args, {
      cwd,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
      timeout: 300_000,
    });
  } catch (e) {
    const { stdout, stderr } = e as { stdout?: string; stderr?: string };
    throw Object.assign(new Error(`${cmd} ${args.join(" ")} failed:\n${stdout ?? ""}${stderr ?? ""}`), {
      stdout,
    });
  }
}

describe("the npm package", () => {
  it("packs, installs into an empty Node 20 project, runs its CLI and type-checks its API", () => {
    run("npm", ["pack", "--pack-destination", dir, "--silent"], ROOT);
    const tgz = readdirSync(dir).find((f) => f.endsWith(".tgz"));
    expect(tgz).toBeDefined();
    mkdirSync(project);
    writeFileSync(
      join(project, "package.json"),
      JSON.stringify({ name: "consumer", private: true, type: "module" }),
    );
    run(
      "npm",
      [
        "install",
        join(dir, tgz!),
        "typescript@5.9.3",
        "@types/node@20.19.43",
        "--prefer-offline",
        "--no-audit",
        "--no-fund",
        "--silent",
      ],
      project,
    );
    const installed = readdirSync(join(project, "node_modules"));
    expect(installed).toContain("marft");
    expect(installed).not.toContain("tsx"); // the CLI must start without the dev toolchain
    const help = run(join(project, "node_modules/.bin/marft"), ["--help"], project);
    expect(help).toContain("train-app");
    expect(help).toContain("serve");
    expect(run(join(project, "node_modules/.bin/marft"), ["serve", "--help"], project)).toContain(
      "usage: marft serve",
    );
    expect(run(join(project, "node_modules/.bin/marft"), ["setup", "--help"], project)).toContain(
      "usage: marft setup",
    );

    // the dashboard's browser code ships as source and is bundled when a page is first rendered
    const page = run(
      process.execPath,
      [
        "--input-type=module",
        "-e",
        'const { renderPage } = await import("./node_modules/marft/dist/dashboard/page.js"); ' +
          'process.stdout.write(renderPage({ mode: "live" }).html);',
      ],
      project,
    );
    expect(page).toContain("<script>");
    expect(page.length).toBeGreaterThan(20_000); // uPlot and the client inlined

    writeFileSync(join(project, "consumer.ts"), CONSUMER_TS);
    writeFileSync(
      join(project, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2022",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          strict: true,
          noEmit: true,
          types: ["node"],
        },
        files: ["consumer.ts"],
      }),
    );
    run(join(project, "node_modules/.bin/tsc"), ["-p", "."], project);
    // the type check can fail: an app run returning a string is refused
    writeFileSync(
      join(project, "consumer.ts"),
      `${CONSUMER_TS}\nconst bad: AppRun<Task> = async () => "1";\n`,
    );
    let typeErrors = "";
    try {
      run(join(project, "node_modules/.bin/tsc"), ["-p", "."], project);
    } catch (e) {
      typeErrors = String((e as { stdout?: string }).stdout);
    }
    expect(typeErrors).toMatch(/consumer\.ts.*error TS2322/);

    writeFileSync(join(project, "consumer.mjs"), CONSUMER_MJS);
    const out = JSON.parse(run("node", ["consumer.mjs"], project)) as Record<string, unknown>;
    expect(out).toEqual({ models: ["solver"], denied: 401, noEngine: 503 });
  }, 600_000);
});
