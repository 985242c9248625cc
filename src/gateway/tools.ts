// Tool calls in the Hermes format: what a chat template that renders tools (Qwen2 / 2.5 / 3,
// Hermes, SmolLM3, the engine's tiny presets) teaches the model to write, and what the gateway parses
// back into OpenAI `tool_calls`:
//
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
//
// Text before the first call is the message's content (null when empty). A block that is not valid
// JSON with a string `name` is not a call: the whole output then stays content, as the model wrote
// it, so a half-written call is visible to the app instead of silently dropped.
import { randomBytes } from "node:crypto";
import type { ToolCall } from "./openai.ts";

const BLOCK = /<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g;

export interface ParsedOutput {
  content: string | null;
  toolCalls: ToolCall[];
}

export function newToolCallId(): string {
  return `call_${randomBytes(12).toString("base64url")}`;
}

/** Splits a model's output into content and Hermes-format tool calls. */
export function parseToolCalls(text: string, makeId: () => string = newToolCallId): ParsedOutput {
  const first = text.indexOf("<tool_call>");
  if (first < 0) return { content: text, toolCalls: [] };
  const calls: ToolCall[] = [];
  for (const m of text.matchAll(BLOCK)) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(m[1]!);
    } catch {
      return { content: text, toolCalls: [] };
    }
    if (!parsed || typeof parsed !== "object" || typeof (parsed as { name?: unknown }).name !== "string") {
      return { content: text, toolCalls: [] };
    }
    const { name, arguments: args } = parsed as { name: string; arguments?: unknown };
    calls.push({
      id: makeId(),
      type: "function",
      function: { name, arguments: typeof args === "string" ? args : JSON.stringify(args ?? {}) },
    });
  }
  if (calls.length === 0) return { content: text, toolCalls: [] };
  const before = text.slice(0, first).trim();
  return { content: before === "" ? null : before, toolCalls: calls };
}

/**
 * A tool call as chat templates read it: `arguments` as an object where the JSON string parses to
 * one (templates write it with `tojson`; a string would be quoted twice), else the string.
 */
export function templateToolCall(t: ToolCall): Record<string, unknown> {
  let args: unknown = t.function.arguments;
  try {
    const v: unknown = JSON.parse(t.function.arguments);
    if (v && typeof v === "object" && !Array.isArray(v)) args = v;
  } catch {
    // not JSON: the template gets the string as the app sent it
  }
  return { id: t.id, type: "function", function: { name: t.function.name, arguments: args } };
}
