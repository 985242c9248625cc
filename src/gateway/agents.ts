// The team of a run config as the gateway serves it: each agent's adapter (a frozen agent answers
// from the bare base) and its sampling settings as the defaults of its requests.
import { BASE_ADAPTER } from "../client/compute.ts";
import { adapterOf } from "../config/derived.ts";
import type { RunConfig } from "../config/schema.ts";
import type { GatewayAgent } from "./server.ts";

export function gatewayAgents(c: RunConfig): GatewayAgent[] {
  return c.agents.map((a) => ({
    id: a.id,
    adapter: a.trainable ? adapterOf(a) : BASE_ADAPTER,
    base: a.base,
    sampling: {
      temperature: a.sampling.temperature,
      topP: a.sampling.topP,
      topK: a.sampling.topK,
      maxNewTokens: a.sampling.maxNewTokens,
      stop: a.sampling.stop,
      draftTokens: a.sampling.draftTokens,
    },
  }));
}
