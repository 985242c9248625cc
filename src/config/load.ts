// Loading a run config: YAML -> `--set` overrides -> validation, and the resolved config back as YAML.
import { readFileSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { parse as parseYaml, parseDocument, stringify as stringifyYaml } from "yaml";
import { ConfigError } from "../errors.ts";
import { errorMap, issueLines } from "../fields.ts";
import { type RunConfig, RunConfigSchema } from "./schema.ts";

/** Validate a parsed YAML value; throws ConfigError naming every bad path. */
export function parseRunConfig(value: unknown, source = "config"): RunConfig {
  const r = RunConfigSchema.safeParse(value, { reportInput: true, error: errorMap });
  if (r.success) return r.data;
  throw new ConfigError(
    source,
    r.error.issues.flatMap((i) => issueLines(i)),
  );
}

// ---------------------------------------------------------------------------------------------------
// --set overrides

/** `agents[1].sampling.temperature` -> ["agents", 1, "sampling", "temperature"]. */
export function parseSetPath(path: string): Array<string | number> {
  const out: Array<string | number> = [];
  const re = /([^.[\]]+)|\[(\d+)\]/g;
  let consumed = "";
  for (let m = re.exec(path); m; m = re.exec(path)) {
    if (m[1] !== undefined) out.push(/^\d+$/.test(m[1]) ? Number(m[1]) : m[1]);
    else out.push(Number(m[2]));
    consumed += m[0];
  }
  if (out.length === 0 || consumed.length !== path.replaceAll(".", "").length)
    throw new Error(`--set: bad path "${path}"`);
  return out;
}

/**
 * Apply `path=value` overrides to a raw (unvalidated) config; values are YAML scalars or flow
 * collections (`--set train.iterations=5`, `--set graph={kind: parallel}`). Validation comes after.
 */
export function applySets(raw: unknown, sets: string[]): unknown {
  const root = structuredClone(raw ?? {}) as Record<string | number, unknown>;
  for (const s of sets) {
    const eq = s.indexOf("=");
    if (eq <= 0) throw new ConfigError("--set", [`expected path=value, got ${JSON.stringify(s)}`]);
    const path = parseSetPath(s.slice(0, eq));
    let value: unknown;
    try {
      value = parseYaml(s.slice(eq + 1));
    } catch (e) {
      throw new ConfigError("--set", [
        `${s.slice(0, eq)}: the value is not valid YAML (${(e as Error).message.split("\n")[0]})`,
      ]);
    }
    setPath(root, path, value);
  }
  return root;
}

/** Overrides given as a mapping, path -> value (a compare spec's `set`), applied like --set. */
export function applyOverrides(raw: unknown, overrides: Readonly<Record<string, unknown>>): unknown {
  const root = structuredClone(raw ?? {}) as Record<string | number, unknown>;
  for (const [path, value] of Object.entries(overrides))
    setPath(root, parseSetPath(path), structuredClone(value));
  return root;
}

/** Sets `root[path]`, creating the objects and lists on the way. */
function setPath(root: Record<string | number, unknown>, path: Array<string | number>, value: unknown): void {
  let node = root;
  for (let i = 0; i < path.length - 1; i++) {
    const k = path[i]!;
    const next = node[k];
    if (next === undefined || next === null || typeof next !== "object") {
      node[k] = typeof path[i + 1] === "number" ? [] : {};
    }
    node = node[k] as Record<string | number, unknown>;
  }
  node[path[path.length - 1]!] = value;
}

/** A YAML file's value; an unreadable file or bad YAML is a ConfigError under `headline`. */
export function readYamlFile(file: string, headline = "invalid run config"): unknown {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new ConfigError(
      file,
      [`cannot read the file (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`],
      headline,
    );
  }
  const doc = parseDocument(text, { prettyErrors: true });
  if (doc.errors.length > 0)
    throw new ConfigError(
      file,
      doc.errors.map((e) => `YAML: ${e.message.split("\n")[0]}`),
      headline,
    );
  return doc.toJS();
}

/** Read a YAML run config, apply overrides, validate. */
export function loadRunConfig(file: string, sets: string[] = []): RunConfig {
  return parseRunConfig(applySets(readYamlFile(file), sets), file);
}

/** The resolved config (defaults filled in) as YAML, for runs/<name>/config.yaml. */
export function configToYaml(c: RunConfig): string {
  return stringifyYaml(c, { lineWidth: 0 });
}

/**
 * The local files a config's bases name (`hf:<dir>`, `gguf:<file>`), checked before an engine
 * starts or a run directory is made; a relative path is taken from `engineCwd`, as the engine takes
 * it. Only for an engine on this machine: a remote engine's paths are on its own disk.
 */
export function checkBaseFiles(c: RunConfig, source: string, engineCwd: string): void {
  const issues: string[] = [];
  for (const [name, b] of Object.entries(c.bases)) {
    const m = /^(hf|gguf):(.+)$/.exec(b.source);
    if (!m) continue;
    const path = resolve(engineCwd, m[2]!);
    const wanted = m[1] === "hf" ? "directory" : "file";
    let found: "directory" | "file" | undefined;
    try {
      found = statSync(path).isDirectory() ? "directory" : "file";
    } catch {
      found = undefined;
    }
    if (found !== wanted)
      issues.push(
        `bases.${name}.source: ${b.source}: ${found ? `${path} is a ${found}, not a ${wanted}` : `no such ${wanted} ${path}`}`,
      );
  }
  if (issues.length > 0) throw new ConfigError(source, issues);
}
