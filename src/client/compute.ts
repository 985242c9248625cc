// The seam between the framework and the compute engine: what the rollout and the trainer call.
// `EngineClient` (client.ts) implements it over HTTP; unit tests of the loop may use an in-memory
// fake (tests/helpers/fake-engine.ts) beside the integration tests against the real engine.
// The protocol types come from the generated `openapi.d.ts` (made by `make openapi` from the
// engine's pydantic models); nothing here re-declares them.
import type { components } from "./openapi.d.ts";

export type Schemas = components["schemas"];

/** Per-call options: a timeout (ms) and an abort signal. */
export interface CallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface ComputeEngine {
  health(o?: CallOptions): Promise<Schemas["Health"]>;
  stats(o?: CallOptions): Promise<Schemas["Stats"]>;
  listBases(o?: CallOptions): Promise<Schemas["BaseList"]>;
  createBase(body: Schemas["BaseCreate"], o?: CallOptions): Promise<Schemas["BaseInfo"]>;
  listAdapters(o?: CallOptions): Promise<Schemas["AdapterList"]>;
  createAdapter(body: Schemas["AdapterCreate"], o?: CallOptions): Promise<Schemas["AdapterInfo"]>;
  deleteAdapter(name: string, o?: CallOptions): Promise<Schemas["AdapterInfo"]>;
  sample(body: Schemas["SampleBatch"], o?: CallOptions): Promise<Schemas["SampleResponse"]>;
  forward(body: Schemas["ForwardRequest"], o?: CallOptions): Promise<Schemas["ForwardResponse"]>;
  forwardBackward(
    body: Schemas["ForwardBackwardRequest"],
    o?: CallOptions,
  ): Promise<Schemas["ForwardBackwardResponse"]>;
  /** Several forward_backward calls, answered as if made one after another; policy calls of one base share passes. */
  forwardBackwardBatch(
    body: Schemas["ForwardBackwardBatch"],
    o?: CallOptions,
  ): Promise<Schemas["ForwardBackwardBatchResponse"]>;
  /** Token sequences of one base's tokenizer as another base's tokenizer reads their text. */
  retokenize(body: Schemas["RetokenizeRequest"], o?: CallOptions): Promise<Schemas["RetokenizeResponse"]>;
  optimStep(body: Schemas["OptimStepRequest"], o?: CallOptions): Promise<Schemas["OptimStepResponse"]>;
  saveCheckpoint(body: Schemas["CheckpointRequest"], o?: CallOptions): Promise<Schemas["CheckpointResponse"]>;
  loadCheckpoint(body: Schemas["CheckpointRequest"], o?: CallOptions): Promise<Schemas["CheckpointResponse"]>;
}

/** Current version of every adapter on the engine, by name. */
export async function adapterVersions(engine: ComputeEngine): Promise<Record<string, number>> {
  const { adapters } = await engine.listAdapters();
  return Object.fromEntries(adapters.map((a) => [a.name, a.version]));
}

/** The adapter name that means "the bare base, no adapter" in sample and forward calls. */
export const BASE_ADAPTER = "__base__";
