// The same team with the Vercel AI SDK (`ai` and `@ai-sdk/openai-compatible`), streaming:
//
//   npx marft train-app examples/team.yaml --app examples/vercel-duo/app.ts
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { streamText } from "ai";
import { checkerPrompt, type SecretTask, score, solverPrompt } from "../secret.ts";

export { tasks } from "../secret.ts";

export interface Context {
  baseURL: string;
  apiKey: string;
  headers: Record<string, string>;
  signal?: AbortSignal;
}

export async function run(task: SecretTask, ctx: Context) {
  const provider = createOpenAICompatible({
    name: "marft",
    baseURL: ctx.baseURL,
    apiKey: ctx.apiKey,
    headers: ctx.headers,
    includeUsage: true,
  });
  const ask = async (agent: string, prompt: string) => {
    const result = streamText({
      model: provider(agent),
      system: "",
      prompt,
      abortSignal: ctx.signal,
      maxRetries: 0,
    });
    let text = "";
    for await (const delta of result.textStream) text += delta;
    return text;
  };
  const said = await ask("solver", solverPrompt(task));
  const final = await ask("checker", checkerPrompt(said));
  return score(task, said, final);
}
