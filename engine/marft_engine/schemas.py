"""The engine's HTTP protocol: every request and response body.

These pydantic models are the single source of truth. FastAPI turns them into the OpenAPI document
(`engine/openapi.json`), and the TypeScript client's types are generated from that document.

Conventions
- Per-token arrays in a `Datum` are aligned with `tokens`: entry i refers to token i as predicted
  from tokens[:i]. Entry 0 has no prediction and is ignored (weights[0] must be 0).
- `weights` is 1 on positions the policy wrote (action tokens) and 0 elsewhere (prompt, other
  agents' text, padding).
- Log-probabilities are natural logs.
- Temperature: every log-prob the engine returns or trains on is computed from logits / temperature
  (the tempered policy). `sample` reports them for the temperature it sampled with, so passing the
  same temperature to `forward` / `forward_backward` reproduces them (the parity tests pin this).
  Top-k / top-p truncation is NOT part of that policy: `sampler_logprobs` gives the log-prob under the
  truncated, renormalised distribution the token was actually drawn from, for callers that need it.
  Greedy (temperature 0): `logprobs` are at temperature 1 (pass temperature 1 to `forward`), and
  `sampler_logprobs` are 0 (the sampler is a point mass).
- Completions: `response_ids` are exactly the sampled tokens. A row that ends on eos includes the eos
  token (finish_reason "eos"); a row that ends on a stop string includes the token that completed it
  (finish_reason "stop"); `text` is the decoded response without the eos token and cut before the
  stop string. Train on the ids, never on re-tokenized text.
- Seeds: each completion draws from its own generator, seeded by (request seed, sample index) when
  the request has a seed, else by (batch seed, request index, sample index); the batch seed defaults
  to a draw from the engine's RNG (saved in checkpoints). So a seeded request samples the same tokens
  whichever other rows (adapters, calls) share its decode batch.
- Sampling is continuously batched: concurrent `sample` calls on one base join one decode batch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Unknown fields are errors, so a typo in a client is a 422 that names the field; NaN and
    infinities are refused (the server refuses them in the JSON already, with a 400)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Answer(Strict):
    """A response body. It may hold a non-finite number (finite inputs can drive a result out of
    range), so that the server can answer it with a 400 naming the field rather than fail here."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=True)


# ----------------------------------------------------------------------------------------------------
# bases and adapters


class BaseCreate(Strict):
    name: str = Field(min_length=1, max_length=128, description="Name the base is referred to by.")
    source: str = Field(
        description="tiny:<preset> (random init from a config; presets: llama, qwen2), hf:<local dir>, "
        "gguf:<file>, pkg:smollm2-135m-instruct, or pkg:gemma3-270m (the pretrained Gemma 3 270M, with a "
        "plain User:/Assistant: transcript as its chat template)"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="auto: bfloat16 on a GPU, and on a CPU only where it has native bf16 instructions "
        "(the avx512_bf16 or amx_bf16 flag), else float32; BaseInfo.dtype_reason says which applied. "
        "bfloat16 on a CPU: every pass runs under bf16 autocast, with linear weights stored bf16 and "
        "decode attention in fp32 over a bf16 KV cache (fp32 where the engine's attention kernel cannot "
        "be built). LoRA weights and optimizer state stay fp32.",
    )
    seed: int = Field(0, ge=-(2**63), lt=2**63, description="Seed for random-init (tiny:) bases.")
    prefix_cache_mb: float = Field(
        0,
        ge=0,
        description="memory budget (MiB) of the sampler's shared-prefix KV cache on this base: a prompt "
        "that starts with the same tokens as an earlier or concurrent one of the same adapter (at the same "
        "weights) prefills only the rest. Caches are never shared across adapters (LoRA changes every "
        "later layer's keys and values). 0 = off, the default: reuse changes the order of floating-point "
        "sums, so sampled log-probs match a forward pass within the parity tolerance, not bit for bit.",
    )


class BaseInfo(Answer):
    name: str
    source: str
    vocab_size: int
    context_length: int
    num_parameters: int
    eos_token_ids: list[int]
    pad_token_id: int
    device: str
    dtype: str
    dtype_reason: str = Field(description="why this dtype: requested, or what auto saw on this device")
    tools: bool = Field(False, description="the chat template renders tool definitions (SampleRequest.tools)")


class LoraConfig(Strict):
    r: int = Field(8, ge=1, le=1024)
    alpha: float = Field(16, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"], min_length=1)
    layers: list[int] | None = Field(
        None,
        description="only these transformer layers (0-based; negative counts from the last); null = all. "
        "A critic on the top layers only is much cheaper to train: backward stops below its lowest layer.",
    )


class OptimizerConfig(Strict):
    lr: float = Field(1e-5, gt=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)


class AdapterCreate(Strict):
    name: str = Field(min_length=1, max_length=128, description="Unique over all bases; not __base__.")
    base: str
    kind: Literal["policy", "critic"] = "policy"
    lora: LoraConfig = Field(default_factory=LoraConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    value_head_hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=list,
        max_length=8,
        description="critic only: hidden sizes of the MLP value head (empty = linear head)",
    )
    init_from: str | None = Field(None, description="a PEFT adapter directory to load the weights from")
    seed: int = Field(0, ge=-(2**63), lt=2**63)


class AdapterInfo(Answer):
    name: str
    base: str
    kind: Literal["policy", "critic"]
    version: int
    num_trainable_parameters: int
    lora: LoraConfig


class AdapterList(Answer):
    adapters: list[AdapterInfo]


class BaseList(Answer):
    bases: list[BaseInfo]


# ----------------------------------------------------------------------------------------------------
# sampling


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = Field(None, description="required, except for an assistant message with tool_calls")
    token_ids: list[int] | None = Field(
        None,
        description="assistant only: the ids this message was sampled as (a completion's response_ids); "
        "the prompt then holds these ids verbatim where the template puts the content, instead of a "
        "re-tokenization of the text (token-in, token-out; see chat.py)",
    )
    tool_calls: list[dict[str, Any]] | None = Field(
        None,
        description="assistant: tool calls as the chat template reads them ({type, function: {name, arguments}})",
    )
    tool_call_id: str | None = Field(None, description="tool: the call this message answers")
    name: str | None = Field(None, description="tool: the function's name")


class SamplingParams(Strict):
    temperature: float = Field(1.0, ge=0, description="0 = greedy (log-probs then at temperature 1)")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 = no top-k")
    max_new_tokens: int = Field(64, ge=1)
    stop: list[str] = Field(default_factory=list, description="stop strings; the text is cut before one")
    n: int = Field(1, ge=1, le=256, description="samples per prompt")
    ignore_eos: bool = Field(
        False, description="keep sampling past eos until max_new_tokens or a stop string (benchmarks)"
    )
    draft_tokens: int = Field(
        0,
        ge=0,
        le=32,
        description="speculative decoding: a step may feed up to this many tokens that followed an earlier "
        "occurrence of the row's last 2 tokens in its prompt and response (prompt lookup) and keep those "
        "that exact speculative sampling accepts; the tokens keep the same distribution (another draw "
        "than with 0). 0 = off",
    )


class SampleRequest(Strict):
    adapter: str = Field(description="policy adapter name, or __base__ for the bare base (then give base)")
    base: str | None = Field(None, description="required with adapter __base__; else inferred")
    messages: list[ChatMessage] | None = Field(None, description="templated by the engine's chat template")
    tools: list[dict[str, Any]] | None = Field(
        None,
        description="tool definitions for the chat template (with messages; the base's template must render tools)",
    )
    prompt_ids: list[int] | None = Field(None, description="raw prompt token ids (instead of messages)")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    seed: int | None = Field(
        None,
        description="seeds this request's samples by (seed, sample index) alone, so they do not depend on "
        "the batch they share; default: derived from the batch seed and the request's position",
    )


class SampleBatch(Strict):
    requests: list[SampleRequest] = Field(min_length=1)
    seed: int | None = Field(None, description="makes the whole batch reproducible")


class Completion(Answer):
    response_ids: list[int] = Field(description="the sampled tokens, with the eos / stop-completing token")
    logprobs: list[float] = Field(description="per response token, under the tempered policy")
    sampler_logprobs: list[float] = Field(description="per response token, under the truncated sampler")
    text: str
    finish_reason: Literal["stop", "eos", "length"]


class SampleResult(Answer):
    prompt_ids: list[int]
    retokenized: list[int] = Field(
        default_factory=list,
        description="indices of messages whose token_ids could not be spliced (the template does not render "
        "their content verbatim once): those went in as re-tokenized text",
    )
    adapter: str
    adapter_version: int
    completions: list[Completion]


class SampleResponse(Answer):
    results: list[SampleResult] = Field(description="one per request, in request order")
    tokens_sampled: int
    seconds: float


# ----------------------------------------------------------------------------------------------------
# forward and training


class Datum(Strict):
    tokens: list[int] = Field(min_length=2)
    weights: list[float] | None = Field(None, description="1 on action tokens; default all but token 0")
    old_logprobs: list[float] | None = None
    advantages: list[float] | None = None
    returns: list[float] | None = None
    old_values: list[float] | None = None


class ForwardRequest(Strict):
    adapter: str = Field(description="policy or critic adapter, or __base__ (adapters disabled)")
    base: str | None = None
    data: list[Datum] = Field(min_length=1)
    temperature: float = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(8192, ge=16)


class ForwardResult(Answer):
    logprobs: list[float] | None = Field(
        None,
        description="aligned with tokens; entry 0 is 0, and so is every entry whose datum weight is 0 "
        "(weights select the positions worth computing, e.g. a response)",
    )
    entropies: list[float] | None = Field(None, description="entropy of the predictive distribution")
    values: list[float] | None = Field(None, description="critic: values[i] = V(tokens[: i + 1])")


class ForwardResponse(Answer):
    results: list[ForwardResult]


class PPOConfig(Strict):
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.2, ge=0)
    entropy_coef: float = 0.0
    kl_coef: float = Field(0.0, ge=0, description="penalty to the reference (base, adapters off)")
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    ratio: Literal["token", "sequence"] = Field(
        "token", description="token: per-token ratios; sequence: one ratio per datum (action level)"
    )
    sequence_logprob: Literal["sum", "mean"] = Field(
        "sum", description="for ratio=sequence: the action log-prob is the token sum or mean"
    )
    aggregation: Literal["token-mean", "token-sum"] = Field(
        "token-mean",
        description="token-mean: mean over all weighted tokens of the call; token-sum: per-datum sum, "
        "mean over data",
    )


class ValueConfig(Strict):
    loss: Literal["mse", "huber"] = "mse"
    huber_delta: float = Field(10.0, gt=0)
    clip: float | None = Field(0.2, description="clip values to old_values ± clip; null = unclipped")


class ForwardBackwardRequest(Strict):
    adapter: str
    loss: Literal["ppo", "importance_sampling", "cross_entropy", "value"]
    data: list[Datum] = Field(min_length=1)
    temperature: float = Field(1.0, gt=0)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    value: ValueConfig = Field(default_factory=ValueConfig)
    loss_scale: float = Field(
        1.0, description="multiplies the loss before backward, to weight calls that accumulate"
    )
    micro_batch_tokens: int = Field(8192, ge=16, description="token budget per micro-batch")


class ForwardBackwardResponse(Answer):
    loss: float
    stats: dict[str, float] = Field(
        description="e.g. clipfrac, approx_kl, entropy, kl_ref, ratio_mean, value_mean, tokens, micro_batches"
    )
    num_data: int
    num_tokens: int


class ForwardBackwardBatch(Strict):
    calls: list[ForwardBackwardRequest] = Field(
        min_length=1,
        description="forward_backward calls answered as if made one after another: each call's "
        "gradients accumulate into its own adapter, with its own normalisers, loss scale and stats. "
        "Policy calls (ppo, importance_sampling, cross_entropy) on one base share micro-batches, each "
        "row through its own adapter's LoRA; critic calls run on their own. Every call is checked "
        "before any runs.",
    )


class ForwardBackwardBatchResponse(Answer):
    results: list[ForwardBackwardResponse] = Field(description="one per call, in call order")
    fused_passes: int = Field(description="micro-batch passes that carried rows of several calls")


class RetokenizeRequest(Strict):
    from_base: str
    to_base: str
    ids: list[list[int]] = Field(description="token sequences of from_base's tokenizer")


class RetokenizeResponse(Answer):
    ids: list[list[int]] = Field(
        description="each sequence decoded by from_base's tokenizer (special tokens kept as text) and "
        "encoded by to_base's, without added special tokens: how a critic on one base reads the turns "
        "of agents on another"
    )


class OptimStepRequest(Strict):
    adapter: str
    lr: float | None = Field(None, gt=0, description="overrides the adapter's learning rate from now on")
    max_grad_norm: float | None = Field(1.0, gt=0, description="null = no clipping")


class OptimStepResponse(Answer):
    adapter: str
    version: int
    grad_norm: float = Field(description="before clipping")
    lr: float


# ----------------------------------------------------------------------------------------------------
# checkpoints and service


class CheckpointRequest(Strict):
    path: str = Field(
        description="a directory inside the engine's checkpoint root (a relative path is taken from "
        "the root); written to a temporary sibling and renamed into place. A save replaces an "
        "existing directory only if it is a MARFT checkpoint."
    )
    adapters: list[str] | None = Field(None, description="default: all adapters")


class CheckpointResponse(Answer):
    path: str
    adapters: list[str]


class Progress(Answer):
    """What a client watches while a long call runs: it is making progress while either moves."""

    beats: int = Field(description="calls and decode steps the compute thread has finished")
    compute_cpu_seconds: float = Field(description="CPU time the compute thread has used")


class Health(Answer):
    status: Literal["ok"]
    version: str
    device: str
    progress: Progress | None = Field(None, description="null from an app with no engine behind it")


class EndpointStats(Answer):
    calls: int
    seconds: float


class PrefixCacheStats(Answer):
    hits: int = Field(0, description="prompts that reused a cached prefix")
    misses: int = Field(0, description="prompts (on bases with a prefix cache) that found none")
    hit_tokens: int = Field(0, description="prompt tokens whose prefill a hit saved")
    prompt_tokens: int = Field(0, description="prompt tokens admitted to the sampler, every base")
    prefill_tokens: int = Field(0, description="of those, the tokens prefilled (not reused)")
    bytes: int = Field(0, description="memory the cached keys and values hold now")
    budget_bytes: int = Field(0, description="the sum of the bases' budgets")
    blocks: int = Field(0, description="cached blocks (16 tokens each)")
    evictions: int = Field(0, description="blocks evicted, least recently used first, to stay in budget")


class ReplicaStats(Answer):
    index: int
    pid: int
    node: str = Field(description="IP address of the node it runs on")
    restarts: int = Field(description="times this replica died and was replaced")
    rss_bytes: int
    tokens_sampled: int
    tokens_trained: int
    decode_steps: int
    decode_rows: int
    prefill_seconds: float
    decode_seconds: float
    sample_calls: int = Field(description="sample calls the front routed to this replica")


class Stats(Answer):
    device: str
    rss_bytes: int
    cuda_allocated_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    tokens_sampled: int
    tokens_trained: int
    decode_steps: int = Field(description="decode steps the sampler has run")
    decode_rows: int = Field(
        description="rows those steps computed: decode_rows / decode_steps is the mean decode batch"
    )
    prefill_seconds: float = Field(
        description="wall seconds the sampler spent admitting rows: prefills and their first tokens"
    )
    decode_seconds: float = Field(description="wall seconds the sampler spent in decode steps")
    drafted_tokens: int = Field(description="speculative decoding (draft_tokens): drafted tokens fed")
    accepted_drafts: int = Field(description="drafted tokens accepted: accepted_drafts / drafted_tokens")
    endpoints: dict[str, EndpointStats]
    prefix_cache: PrefixCacheStats = Field(
        default_factory=lambda: PrefixCacheStats(),
        description="the sampler's shared-prefix KV cache, all bases",
    )
    replicas: list[ReplicaStats] | None = Field(
        None,
        description="an engine of several replicas (engine.replicas): each one's figures; the figures "
        "above are their sums",
    )


class ErrorBody(Answer):
    error: str = Field(description="machine-readable kind: bad_request, not_found, internal, unauthorized")
    message: str = Field(description="what was wrong, naming the field")
