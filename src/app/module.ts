// An app module for `marft train-app --app FILE`: it exports `run(task, context)` and, unless the
// config's task section names task files, `tasks` (a list, or { train, eval }); optionally
// `taskId(task, index)`. TypeScript modules load through tsx: already registered when the CLI runs
// from a checkout, else resolved from the app's own project (`npm install -D tsx` there).
import { createRequire } from "node:module";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { ConfigError } from "../errors.ts";
import type { AppRun } from "./source.ts";
import type { AppTasks } from "./train-app.ts";

export interface AppModule {
  run: AppRun<unknown>;
  tasks?: AppTasks<unknown>;
  taskId?: (task: unknown, index: number) => string;
}

async function importFile(file: string): Promise<Record<string, unknown>> {
  const url = pathToFileURL(file).href;
  try {
    return (await import(url)) as Record<string, unknown>;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code !== "ERR_UNKNOWN_FILE_EXTENSION" || !/\.[mc]?tsx?$/.test(file)) throw e;
  }
  let api: string;
  try {
    api = createRequire(file).resolve("tsx/esm/api");
  } catch {
    throw new ConfigError("--app", [
      `${file}: a TypeScript app needs tsx in its project (npm install -D tsx), or compile it to JavaScript`,
    ]);
  }
  const { register } = (await import(pathToFileURL(api).href)) as { register: () => unknown };
  register();
  return (await import(url)) as Record<string, unknown>;
}

function isTaskList(v: unknown): boolean {
  if (Array.isArray(v)) return true;
  if (!v || typeof v !== "object") return false;
  const o = v as { train?: unknown; eval?: unknown };
  return Array.isArray(o.train) && (o.eval === undefined || Array.isArray(o.eval));
}

/** Imports the app module and checks what it exports. */
export async function loadAppModule(path: string): Promise<AppModule> {
  const file = resolve(path);
  const m = await importFile(file);
  const issues: string[] = [];
  if (typeof m["run"] !== "function") issues.push("run: expected an exported function run(task, context)");
  if (m["tasks"] !== undefined && !isTaskList(m["tasks"]))
    issues.push("tasks: expected a list of tasks or { train: [...], eval?: [...] }");
  if (m["taskId"] !== undefined && typeof m["taskId"] !== "function")
    issues.push("taskId: expected a function taskId(task, index)");
  if (issues.length > 0) throw new ConfigError(path, issues, "not an app module");
  return m as unknown as AppModule;
}
