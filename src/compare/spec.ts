// A comparison spec (`marft compare SPEC.yaml`): a base run config, named variants of it, seeds, a
// budget every variant trains to, and the held-out evaluation they are all scored on.
//
//   base: tiny-orchestrated.yaml          # relative to the spec file
//   set: { train.evalEvery: 0 }           # overrides for every variant (as --set, path -> value)
//   variants:
//     - team                              # a built-in variant (src/compare/variants.ts)
//     - critic-free
//     - { name: lr-x2, set: { "agents[0].lr": 0.02 } }
//     - { name: cf-replay, builtin: critic-free, set: { train.replay: {} } }
//   seeds: [1, 2, 3]
//   budget: { sampledTokens: 20000 }      # or { iterations: 60 }
//   eval: { n: 64 }
import { dirname, resolve } from "node:path";
import { z } from "zod";
import { readYamlFile } from "../config/load.ts";
import { ConfigError } from "../errors.ts";
import { errorMap, issueLines, name, nonNegInt, posInt } from "../fields.ts";
import { BUILTIN_NAMES } from "./variants.ts";

const variantName = () =>
  z.string({ error: "expected a variant name" }).regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/, {
    error: "expected a variant name of letters, digits, '.', '_' or '-' (it names a directory)",
  });

const Overrides = z
  .record(z.string(), z.unknown())
  .default({})
  .describe('run config overrides, path -> value, as marft train --set (e.g. "agents[0].lr": 0.02)');

const Variant = z.union([
  z.enum(BUILTIN_NAMES, {
    error: `expected a built-in variant (${BUILTIN_NAMES.join(", ")}) or {name, builtin?, set?}`,
  }),
  z.strictObject({
    name: variantName().describe("the variant's name in the report and its directory"),
    builtin: z.enum(BUILTIN_NAMES).optional().describe("a built-in variant to start from (default: team)"),
    set: Overrides,
  }),
]);

export const CompareSpecSchema = z
  .strictObject({
    base: name().describe("the run config every variant starts from, relative to the spec file"),
    set: Overrides.describe("overrides of the base for every variant, applied before the variant's"),
    variants: z
      .array(Variant)
      .min(1, { error: "expected at least one variant" })
      .describe("the variants; each is compared with the FIRST one"),
    seeds: z
      .array(nonNegInt())
      .min(1, { error: "expected at least one seed" })
      .default([0])
      .describe("the run seed of each cell: every variant trains once per seed (3 or more for a claim)"),
    budget: z
      .union(
        [
          z.strictObject({
            sampledTokens: posInt().describe("train.maxSampledTokens of every variant"),
            maxIterations: posInt()
              .default(100_000)
              .describe("an upper bound on iterations; a variant that reaches it is flagged under budget"),
          }),
          z.strictObject({
            iterations: posInt().describe("the same number of iterations for every variant"),
          }),
        ],
        { error: "expected {sampledTokens: N} or {iterations: N}" },
      )
      .describe(
        "what every variant trains for: the same sampled tokens (fair by construction) or iterations",
      ),
    eval: z
      .strictObject({
        n: nonNegInt().optional().describe("held-out problems (per task in a multi-task run; 0: all)"),
        greedy: z.boolean({ error: "expected true or false" }).optional().describe("greedy pass@1"),
      })
      .prefault({})
      .describe("the held-out evaluation every cell is scored on (default: the base config's)"),
    checkpointEvery: posInt()
      .default(5)
      .describe("checkpoint every N iterations, so a crashed cell resumes near where it stopped"),
    neutralPrompt: z
      .string()
      .default("You are a helpful assistant.")
      .describe("the system prompt every agent gets in the `anonymous` variant"),
  })
  .superRefine((s, ctx) => {
    const seen = new Map<string, number>();
    s.variants.forEach((v, i) => {
      const n = variantNameOf(v);
      if (seen.has(n))
        ctx.addIssue({
          code: "custom",
          path: ["variants", i],
          message: `duplicate variant name "${n}" (also variants[${seen.get(n)}]); give one a name`,
          input: n,
        });
      seen.set(n, i);
    });
    if (new Set(s.seeds).size !== s.seeds.length)
      ctx.addIssue({ code: "custom", path: ["seeds"], message: "expected distinct seeds", input: s.seeds });
  });

export type CompareSpec = z.output<typeof CompareSpecSchema>;
export type VariantSpec = CompareSpec["variants"][number];

export function variantNameOf(v: VariantSpec): string {
  return typeof v === "string" ? v : v.name;
}

/** Validate a parsed spec; errors name the field, e.g. `budget.sampledTokens: expected a positive integer`. */
export function parseCompareSpec(value: unknown, source = "compare spec"): CompareSpec {
  const r = CompareSpecSchema.safeParse(value, { reportInput: true, error: errorMap });
  if (r.success) return r.data;
  throw new ConfigError(
    source,
    r.error.issues.flatMap((i) => issueLines(i)),
    "invalid compare spec",
  );
}

/** Read a spec file; returns it with the directory its paths are relative to. */
export function loadCompareSpec(file: string): { spec: CompareSpec; dir: string } {
  return {
    spec: parseCompareSpec(readYamlFile(file, "invalid compare spec"), file),
    dir: dirname(resolve(file)),
  };
}
