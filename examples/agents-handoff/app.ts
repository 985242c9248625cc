// A team written with the OpenAI Agents SDK for JS (`@openai/agents`), through its chat-completions
// model: a solver that may hand the conversation off to a checker (the SDK offers the handoff to the
// model as a `transfer_to_checker` tool; a base whose chat template renders tools can call it), and
// the final answer is whoever answered last. MARFT trains it unmodified:
//
//   npx marft train-app examples/team.yaml --app examples/agents-handoff/app.ts
//
// The handoff is the model's decision, so it is part of what training changes. The tool call and the
// SDK's tool result go back to the gateway in the checker's prompt: the call is the solver's output,
// so the checker's turn has the solver's turn as its parent, and the call's sampled ids are reused.
import { Agent, OpenAIChatCompletionsModel, run as runAgents, setTracingDisabled } from "@openai/agents";
import OpenAI from "openai";
import { type SecretTask, score, solverPrompt } from "../secret.ts";

export { tasks } from "../secret.ts";

setTracingDisabled(true); // no traces to api.openai.com: the gateway is the only server

export interface Context {
  baseURL: string;
  apiKey: string;
  headers: Record<string, string>;
  signal?: AbortSignal;
}

export async function run(task: SecretTask, ctx: Context) {
  const client = new OpenAI({ baseURL: ctx.baseURL, apiKey: ctx.apiKey, defaultHeaders: ctx.headers });
  const checker = new Agent({
    name: "checker",
    instructions: "State the secret letter.",
    handoffDescription: "states the secret letter",
    model: new OpenAIChatCompletionsModel(client, "checker"),
  });
  const solver = new Agent({
    name: "solver",
    instructions: "",
    model: new OpenAIChatCompletionsModel(client, "solver"),
    modelSettings: { maxTokens: 96 }, // room for a tool call (the team's default is 16 tokens)
    handoffs: [checker],
  });
  const result = await runAgents(solver, solverPrompt(task), { maxTurns: 4, signal: ctx.signal });
  const final = typeof result.finalOutput === "string" ? result.finalOutput : "";
  return score(task, "", final).teamReward;
}
