// A gateway in front of a real test engine (tiny random-init model), for the gateway, example and
// SDK tests:
//
//   const gw = useGateway({ agents: ["solver", "checker"] });   // registers beforeAll / afterAll
//   it("...", async () => { new OpenAI({ baseURL: gw.url, apiKey: gw.token }) ... });
import { afterAll, beforeAll } from "vitest";
import type { EngineClient } from "../../src/client/client.ts";
import { BASE_ADAPTER } from "../../src/client/compute.ts";
import { appRunConfig } from "../../src/app/train-app.ts";
import type { RunConfig } from "../../src/config/schema.ts";
import { gatewayAgents } from "../../src/gateway/agents.ts";
import { Gateway, type GatewayAgent } from "../../src/gateway/server.ts";
import { setupEngine } from "../../src/train/setup.ts";
import { createPolicy, createTinyBase, useEngine } from "./engine.ts";

export interface TestGateway {
  readonly url: string;
  readonly token: string;
  readonly gateway: Gateway;
  readonly engine: EngineClient;
  /** GET /v1/episodes/<id> */
  episode(id: string): Promise<EpisodeJson>;
}

export interface EpisodeJson {
  id: string;
  turns: Array<{
    index: number;
    agent: string;
    adapter: string;
    adapter_version: number;
    prompt_ids: number[];
    response_ids: number[];
    logprobs: number[];
    parents: number[];
    text: string;
    content: string | null;
    tool_calls: Array<{ id: string; function: { name: string; arguments: string } }>;
    finish_reason: string;
    sampling: { temperature: number; seed: number | null; max_tokens: number };
    retokenized: number;
    streamed: boolean;
  }>;
}

export const TEST_TOKEN = "test-gateway-token";

/**
 * Agents with their own adapter on the tiny base (`frozen` ones answer from the bare base), or the
 * team of a run config file (`config`), set up on the engine as a training run would.
 */
export function useGateway(opts: {
  agents?: string[];
  frozen?: string[];
  config?: string;
  maxNewTokens?: number;
  maxBodyBytes?: number;
}): TestGateway {
  const eng = useEngine();
  let gateway: Gateway | undefined;
  let url = "";
  beforeAll(async () => {
    let agents: GatewayAgent[];
    if (opts.config) {
      const config: RunConfig = appRunConfig(opts.config, [], true).config;
      await setupEngine(eng.client, config);
      agents = gatewayAgents(config);
    } else {
      const own = opts.agents ?? [];
      await createTinyBase(eng.client);
      for (const [i, a] of own.entries()) await createPolicy(eng.client, a, "tiny", i + 1);
      agents = [...own, ...(opts.frozen ?? [])].map((id) => ({
        id,
        adapter: opts.frozen?.includes(id) ? BASE_ADAPTER : id,
        base: "tiny",
        sampling: { temperature: 1, topP: 1, topK: 0, maxNewTokens: opts.maxNewTokens ?? 8, stop: [] },
      }));
    }
    gateway = new Gateway({ engine: eng.client, agents, token: TEST_TOKEN, maxBodyBytes: opts.maxBodyBytes });
    url = await gateway.listen();
  });
  afterAll(async () => {
    await gateway?.close();
  });
  const need = () => {
    if (!gateway) throw new Error("useGateway: not started yet (use it inside tests or hooks)");
    return gateway;
  };
  return {
    get url() {
      need();
      return url;
    },
    token: TEST_TOKEN,
    get gateway() {
      return need();
    },
    get engine() {
      return eng.client;
    },
    async episode(id: string) {
      const res = await fetch(`${url}/episodes/${encodeURIComponent(id)}`, {
        headers: { authorization: `Bearer ${TEST_TOKEN}` },
      });
      if (!res.ok) throw new Error(`GET /v1/episodes/${id}: ${res.status} ${await res.text()}`);
      return (await res.json()) as EpisodeJson;
    },
  };
}
