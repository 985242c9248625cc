// A two-agent team written with the `openai` npm package, as any app would be: a solver, then a
// checker that sees the solver's answer and gives the final one. MARFT trains it unmodified:
//
//   npx marft train-app examples/team.yaml --app examples/openai-duo/app.ts
//
// `run` is the only thing MARFT needs: it runs the app once on a task against the gateway
// (baseURL, apiKey, and the headers that name the episode) and returns the reward.
import OpenAI from "openai";
import { checkerPrompt, type SecretTask, score, solverPrompt } from "../secret.ts";

export { tasks } from "../secret.ts";

export interface Context {
  baseURL: string;
  apiKey: string;
  headers: Record<string, string>;
  signal?: AbortSignal;
}

export async function run(task: SecretTask, ctx: Context) {
  const client = new OpenAI({ baseURL: ctx.baseURL, apiKey: ctx.apiKey, defaultHeaders: ctx.headers });
  const opts = { signal: ctx.signal };
  const solver = await client.chat.completions.create(
    {
      model: "solver",
      messages: [
        { role: "system", content: "" },
        { role: "user", content: solverPrompt(task) },
      ],
    },
    opts,
  );
  const said = solver.choices[0]?.message.content ?? "";
  const checker = await client.chat.completions.create(
    {
      model: "checker",
      messages: [
        { role: "system", content: "" },
        { role: "user", content: checkerPrompt(said) },
      ],
    },
    opts,
  );
  return score(task, said, checker.choices[0]?.message.content ?? "");
}
