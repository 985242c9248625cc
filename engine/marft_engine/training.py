"""Forward and training passes: log-probs and values (`forward`), a loss's gradients
(`forward_backward`, over the table `LOSSES`), and the optimizer step (`optim_step`).

A call's data are cut into micro-batches of consecutive data within a token budget
(`micro_batches`). Every loss is normalised over the whole call (the call's total weight or number
of data), so the micro-batches' accumulated gradients equal the gradient of one full batch.

Shapes: B = data in a micro-batch, T = its longest datum (shorter ones right-padded), V =
vocabulary, N = positions whose logits are computed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch

from . import lora_batch, losses, unpad
from .errors import BadRequest
from .registry import Adapter, Base, Registry
from .schemas import (
    Datum,
    ForwardBackwardRequest,
    ForwardBackwardResponse,
    ForwardRequest,
    ForwardResponse,
    ForwardResult,
    OptimStepRequest,
    OptimStepResponse,
)
from .shards import CallTotals, value_summary

# Elements of fp32 logits one micro-batch may hold (2^25 = 128 MiB; see micro_batches); on a GPU 1/64
# of its memory if more: with a 152k vocabulary 128 MiB is 220 positions, a pass bound by its launches.
LOGITS_BUDGET = 2**25
# The next two (CPU only): glibc maps allocations over 32 MB fresh when its heap has no room, so passes
# with such tensors fault in pages every call (MEASUREMENTS.md).
HEAD_ROWS = 64  # scored positions the LM head and its softmax take at a time (12.6 MB of fp32 logits)
CPU_ACTIVATION_BYTES = 2**24  # a CPU training micro-batch's tokens x its widest layer x 4 bytes, at most


@contextlib.contextmanager
def active(base: Base, adapter: Adapter | None, train: bool = False) -> Iterator[None]:
    """Run the base's model with exactly `adapter` active (None: all adapters disabled)."""
    if base.peft is None:  # no adapter was ever made on it
        assert adapter is None
        yield
        return
    if adapter is None:
        with base.peft.disable_adapter():
            yield
        return
    # set_adapter also makes only this adapter's LoRA weights require grad
    base.peft.set_adapter(adapter.name)
    base.peft.train(train and adapter.lora.dropout > 0)
    try:
        yield
    finally:
        base.peft.eval()


def validate_data(base: Base, data: list[Datum], need: list[str]) -> None:
    for i, d in enumerate(data):
        n = len(d.tokens)
        if n > base.context_length:
            raise BadRequest(
                f"data[{i}].tokens: length {n} exceeds the context length {base.context_length} of base {base.name!r}"
            )
        for j, t in enumerate(d.tokens):
            if not 0 <= t < base.vocab_size:
                raise BadRequest(
                    f"data[{i}].tokens[{j}]: token id {t} is outside the vocabulary [0, {base.vocab_size})"
                )
        for key in ("weights", "old_logprobs", "advantages", "returns", "old_values"):
            arr = getattr(d, key)
            if arr is not None and len(arr) != n:
                raise BadRequest(f"data[{i}].{key}: length {len(arr)} != len(tokens) {n}")
        for key in need:
            if getattr(d, key) is None:
                raise BadRequest(f"data[{i}].{key}: required by this loss")
        if d.weights is not None and d.weights[0] != 0:
            raise BadRequest(f"data[{i}].weights[0]: must be 0 (token 0 has no prediction)")


def token_budget(base: Base, budget: int) -> int:
    """A training call's micro-batch token budget: on a CPU, at most CPU_ACTIVATION_BYTES of the base's
    widest layer (hidden, MLP or query width) in fp32. Passes without gradients free each layer's
    tensors as they go, and capping them measured no gain."""
    if base.device.type != "cpu":
        return budget
    cfg = base.hf.config.get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    widest = max(
        cfg.hidden_size, getattr(cfg, "intermediate_size", 0) or 0, cfg.num_attention_heads * head_dim
    )
    return max(1, min(budget, CPU_ACTIVATION_BYTES // (4 * widest)))


def micro_batches(data: list[Datum], budget: int, base: Base, critic: bool) -> list[list[int]]:
    """Consecutive groups whose padded size (rows x longest) stays within the token budget, and whose
    fp32 logits stay near LOGITS_BUDGET elements (a GPU: more): with a 49k vocabulary, 8192 tokens'
    fp32 logits are 1.6 GB, and the log-softmax, exp and gradient tensors built from them several
    times that. Logits exist only at the scored positions (weights > 0) for model families with a
    plain LM head (see token_scores), at every position otherwise; a critic has none."""
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    scored = 0  # positions of the current group that need logits (plain head)
    mem = torch.cuda.get_device_properties(base.device).total_memory if base.device.type == "cuda" else 0
    logits = max(LOGITS_BUDGET, mem // 256)  # elements: on a GPU 1/64 of its memory in fp32, if more
    for i, d in enumerate(data):
        n = len(d.tokens)
        padded = (len(cur) + 1) * max(longest, n)
        mine = sum(1 for w in d.weights[1:] if w > 0) if d.weights is not None else n - 1
        logit_rows = 0 if critic else (scored + mine if base.plain_head else padded)
        if cur and (padded > budget or logit_rows * base.vocab_size > logits):
            groups.append(cur)
            cur, longest, scored = [], 0, 0
        cur.append(i)
        longest = max(longest, n)
        scored += mine
    if cur:
        groups.append(cur)
    return groups


def pad(base: Base, data: list[Datum], idx: list[int], key: str) -> torch.Tensor:
    """[B, T] right-padded float tensor of a per-token field, 0 where absent (weights default: all
    but token 0)."""
    T = max(len(data[i].tokens) for i in idx)
    out = torch.zeros((len(idx), T), dtype=torch.float32)
    for r, i in enumerate(idx):
        d = data[i]
        arr = getattr(d, key)
        if arr is None and key == "weights":
            arr = [0.0] + [1.0] * (len(d.tokens) - 1)
        if arr is not None:
            out[r, : len(arr)] = torch.tensor(arr, dtype=torch.float32)
    return out.to(base.device)


def inputs(base: Base, data: list[Datum], idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) [B, T], right-padded."""
    T = max(len(data[i].tokens) for i in idx)
    ids = torch.full((len(idx), T), base.pad_id, dtype=torch.long)
    mask = torch.zeros((len(idx), T), dtype=torch.long)
    for r, i in enumerate(idx):
        n = len(data[i].tokens)
        ids[r, :n] = torch.tensor(data[i].tokens, dtype=torch.long)
        mask[r, :n] = 1
    return ids.to(base.device), mask.to(base.device)


def trunk(base: Base, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The last hidden state [B, T, d] of right-padded ids and their mask [B, T]: on a CPU base over
    the real tokens only (unpad.py), elsewhere the plain padded pass."""
    if base.device.type == "cpu" and unpad.applies(base.hf.config):
        return unpad.trunk(base.hf.model, ids, mask)
    return base.hf.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


def token_scores(
    base: Base, ids: torch.Tensor, mask: torch.Tensor, w: torch.Tensor, temperature: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) [B, T] as losses.logprobs_and_entropies, but only where the weight w [B, T]
    is positive; zero elsewhere. Why: the LM head and its softmax are a vocabulary-wide (49k for
    SmolLM2) matmul and fp32 pass per position, and a policy's loss needs only the action tokens,
    not the prompt's, which are most of a sequence. Other model families (logit scaling or
    soft-capping in their forward) take the full-logits path. temperature: one, or one per row [B]
    (a pass over several calls, training_batch.py)."""
    per_row = isinstance(temperature, torch.Tensor)
    if not base.plain_head:
        with base.autocast():
            logits = base.hf(input_ids=ids, attention_mask=mask, use_cache=False).logits  # [B, T, V]
        t = temperature[:, None, None] if per_row else temperature  # type: ignore[index]
        return losses.logprobs_and_entropies(logits, ids, t)  # type: ignore[arg-type]
    sel = w > 0  # [B, T]
    sel[:, 0] = False  # position 0 predicts nothing
    with base.autocast():
        hidden = trunk(base, ids, mask)  # [B, T, d]
    states = hidden[:, :-1][sel[:, 1:]]  # [N, d]: the state before each selected token
    tokens = ids[sel]  # [N]
    t = temperature[:, None].expand(sel.shape)[sel][:, None] if per_row else temperature  # type: ignore[index]
    logp: list[torch.Tensor] = []
    ent: list[torch.Tensor] = []
    step = HEAD_ROWS if base.device.type == "cpu" else max(1, len(tokens))  # a GPU: all at once
    for s in range(0, len(tokens), step):
        with base.autocast():
            logits = base.hf.lm_head(states[s : s + step])  # [n, V]
        ts = t[s : s + step] if per_row else t  # type: ignore[index]
        lp, en = losses.selected_logprobs_and_entropies(logits, tokens[s : s + step], ts)  # type: ignore[arg-type]  # [n], [n]
        logp.append(lp)
        ent.append(en)
    return losses.scatter_selected(torch.cat(logp), sel), losses.scatter_selected(torch.cat(ent), sel)


def values(base: Base, adapter: Adapter, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values[b, t] = V(tokens[b, : t + 1]) [B, T] from the last (final-norm) hidden state."""
    assert adapter.value_head is not None
    with base.autocast():
        hidden = trunk(base, ids, mask)  # [B, T, d]
    return adapter.value_head(hidden.float()).squeeze(-1)  # [B, T]


def forward(registry: Registry, body: ForwardRequest) -> ForwardResponse:
    base, adapter = registry.resolve(body.adapter, body.base)
    validate_data(base, body.data, [])
    results: list[ForwardResult] = [ForwardResult() for _ in body.data]
    with torch.no_grad(), active(base, adapter):
        critic = adapter is not None and adapter.kind == "critic"
        for idx in micro_batches(body.data, body.micro_batch_tokens, base, critic):
            ids, mask = inputs(base, body.data, idx)
            if critic:
                assert adapter is not None
                v = values(base, adapter, ids, mask)  # [B, T]
                for r, i in enumerate(idx):
                    results[i] = ForwardResult(values=v[r, : len(body.data[i].tokens)].tolist())
                continue
            # weights given: log-probs only where they are positive (e.g. a response), 0 elsewhere
            w = pad(base, body.data, idx, "weights")  # [B, T]
            logp, ent = token_scores(base, ids, mask, w, body.temperature)
            for r, i in enumerate(idx):
                n = len(body.data[i].tokens)
                results[i] = ForwardResult(logprobs=logp[r, :n].tolist(), entropies=ent[r, :n].tolist())
    return ForwardResponse(results=results)


# ----------------------------------------------------------------------------------------------------
# forward_backward: one loop over micro-batches, one table entry per loss


@dataclass
class MicroBatch:
    base: Base
    adapter: Adapter
    data: list[Datum]
    idx: list[int]  # which data
    ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T]
    w: torch.Tensor  # [B, T] weights
    aggregation: str
    norm: float  # the call's normaliser (see losses.aggregate)

    def field(self, key: str) -> torch.Tensor:
        return pad(self.base, self.data, self.idx, key)  # [B, T]

    def policy_scores(self, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy) [B, T] under the adapter being trained, with grad."""
        with active(self.base, self.adapter, train=True):
            return token_scores(self.base, self.ids, self.mask, self.w, temperature)

    def reference_logprobs(self, temperature: float) -> torch.Tensor:
        """logp [B, T] under the bare base (adapters disabled), without grad."""
        with torch.no_grad(), active(self.base, None):
            return token_scores(self.base, self.ids, self.mask, self.w, temperature)[0]

    def values(self) -> torch.Tensor:
        """values [B, T] of the critic being trained, with grad."""
        with active(self.base, self.adapter, train=True):
            return values(self.base, self.adapter, self.ids, self.mask)


@dataclass
class CallStats:
    """Weighted sums over a whole forward_backward call; divided by the total weight at the end."""

    sums: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: torch.Tensor | float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(value)


def _policy_ratio_stats(st: CallStats, logp: torch.Tensor, old: torch.Tensor, w: torch.Tensor) -> None:
    log_r = (logp.detach() - old) * (w > 0)  # [B, T] token-level, whatever the loss's ratio level
    r = log_r.exp()
    st.add("ratio_mean", (r * w).sum())
    st.add("approx_kl", (((r - 1) - log_r) * w).sum())


def _ppo(mb: MicroBatch, body: ForwardBackwardRequest, st: CallStats) -> torch.Tensor:
    cfg = body.ppo
    ref = mb.reference_logprobs(body.temperature) if cfg.kl_coef > 0 else None
    logp, ent = mb.policy_scores(body.temperature)
    st.add("entropy", (ent.detach() * mb.w).sum())
    old, adv = mb.field("old_logprobs"), mb.field("advantages")
    terms = losses.ppo_loss(
        logp,
        old,
        adv,
        mb.w,
        ent if cfg.entropy_coef != 0 else None,
        ref,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        entropy_coef=cfg.entropy_coef,
        kl_coef=cfg.kl_coef,
        kl_estimator=cfg.kl_estimator,
        ratio_level=cfg.ratio,
        sequence_logprob=cfg.sequence_logprob,
        aggregation=mb.aggregation,
        norm=mb.norm,
    )
    st.add("clipfrac", (terms.clipped.float() * mb.w).sum())
    if terms.kl_ref is not None:
        st.add("kl_ref", (terms.kl_ref.detach() * mb.w).sum())
    _policy_ratio_stats(st, logp, old, mb.w)
    return terms.loss


def _importance_sampling(mb: MicroBatch, body: ForwardBackwardRequest, st: CallStats) -> torch.Tensor:
    logp, ent = mb.policy_scores(body.temperature)
    st.add("entropy", (ent.detach() * mb.w).sum())
    old, adv = mb.field("old_logprobs"), mb.field("advantages")
    loss, _ = losses.importance_sampling_loss(logp, old, adv, mb.w, aggregation=mb.aggregation, norm=mb.norm)
    _policy_ratio_stats(st, logp, old, mb.w)
    return loss


def _cross_entropy(mb: MicroBatch, body: ForwardBackwardRequest, st: CallStats) -> torch.Tensor:
    logp, ent = mb.policy_scores(body.temperature)
    st.add("entropy", (ent.detach() * mb.w).sum())
    return losses.cross_entropy_loss(logp, mb.w, aggregation=mb.aggregation, norm=mb.norm)


def _value(mb: MicroBatch, body: ForwardBackwardRequest, st: CallStats) -> torch.Tensor:
    cfg = body.value
    v = mb.values()  # [B, T]
    returns = mb.field("returns")
    old_v = mb.field("old_values") if cfg.clip is not None else None
    loss, clipped = losses.value_loss(
        v,
        returns,
        old_v,
        mb.w,
        kind=cfg.loss,
        huber_delta=cfg.huber_delta,
        clip=cfg.clip,
        aggregation=mb.aggregation,
        norm=mb.norm,
    )
    v, w = v.detach(), mb.w
    st.add("value_mean", (v * w).sum())
    st.add("return_mean", (returns * w).sum())
    st.add("return_sq", (returns**2 * w).sum())
    st.add("residual", ((returns - v) * w).sum())
    st.add("residual_sq", ((returns - v) ** 2 * w).sum())
    st.add("clipfrac", (clipped.float() * w).sum())
    return loss


@dataclass(frozen=True)
class Loss:
    trains: Literal["policy", "critic"]  # the adapter kind it trains
    fields: Callable[[ForwardBackwardRequest], list[str]]  # the Datum fields it needs
    # one micro-batch's share of the call's loss (with grad); adds its weighted sums to the stats
    micro_batch: Callable[[MicroBatch, ForwardBackwardRequest, CallStats], torch.Tensor]
    summary: Callable[[dict[str, float]], None] | None = None  # turns the stats' means into figures


LOSSES: dict[str, Loss] = {
    "ppo": Loss("policy", lambda body: ["old_logprobs", "advantages"], _ppo),
    "importance_sampling": Loss("policy", lambda body: ["old_logprobs", "advantages"], _importance_sampling),
    "cross_entropy": Loss("policy", lambda body: [], _cross_entropy),
    "value": Loss(
        "critic",
        lambda body: ["returns"] + (["old_values"] if body.value.clip is not None else []),
        _value,
        value_summary,
    ),
}


@dataclass
class Call:
    """A checked forward_backward call and its call-level normalisers."""

    body: ForwardBackwardRequest
    adapter: Adapter
    loss: Loss
    total_w: float  # the call's total weight
    norm: float  # the loss's normaliser (see losses.aggregate)
    tokens: float  # positions with a positive weight
    own_w: float  # this call's own weight (less than total_w for a shard of a larger call)
    sharded: bool  # a shard: the loss's summary is applied once to the shards' sum, by the front

    @property
    def base(self) -> Base:
        return self.adapter.base


def prepare(
    registry: Registry, body: ForwardBackwardRequest, field_prefix: str = "", call: CallTotals | None = None
) -> Call:
    """`call`: the totals of the whole call when `body` is a shard of it (data-parallel replicas)."""
    adapter = registry.get_adapter(body.adapter, f"{field_prefix}adapter")
    loss = LOSSES[body.loss]
    if adapter.kind != loss.trains:
        raise BadRequest(
            f"{field_prefix}loss: {body.loss!r} needs a {loss.trains} adapter; {adapter.name!r} is a {adapter.kind}"
        )
    data = body.data
    try:
        validate_data(adapter.base, data, loss.fields(body))
    except BadRequest as e:
        raise BadRequest(f"{field_prefix}{e}") from e
    # Normalisers over the whole call, so micro-batch gradients sum to the full-batch gradient.
    all_w = [(d.weights if d.weights is not None else [0.0] + [1.0] * (len(d.tokens) - 1)) for d in data]
    own_w = float(sum(sum(w) for w in all_w))
    total_w, n_data = (call.weight, call.data) if call is not None else (own_w, len(data))
    if total_w <= 0:
        raise BadRequest(f"{field_prefix}data[*].weights: no token has a positive weight")
    norm = total_w if body.ppo.aggregation == "token-mean" else float(n_data)
    tokens = float(sum(sum(1 for x in ws if x > 0) for ws in all_w))
    return Call(body, adapter, loss, total_w, norm, tokens, own_w, call is not None)


def check_finite(call: Call, part: torch.Tensor, adapters: list[Adapter]) -> None:
    """Finite inputs can still drive a loss out of range: refuse it before its backward pass, so no
    adapter's weights become NaN (the gradients accumulated so far are dropped too)."""
    if torch.isfinite(part):
        return
    for a in adapters:
        drop_gradients(a)
    raise BadRequest(
        f"data: the {call.body.loss} loss is {float(part.detach())} (the values drive it out of range); "
        f"adapter {call.adapter.name!r}'s accumulated gradients were dropped, its weights are unchanged"
    )


def finish(call: Call, st: CallStats, total_loss: float, passes: int) -> ForwardBackwardResponse:
    stats = {k: v / call.total_w for k, v in st.sums.items()}
    if call.loss.summary is not None and not call.sharded:
        call.loss.summary(stats)
    if bad := [k for k, v in stats.items() if not math.isfinite(v)]:
        drop_gradients(call.adapter)
        raise BadRequest(
            f"data: the statistic {bad[0]} is {stats[bad[0]]} (the values drive it out of range); "
            f"adapter {call.adapter.name!r}'s accumulated gradients were dropped, its weights are unchanged"
        )
    stats["tokens"] = call.tokens
    stats["weight_sum"] = call.own_w
    stats["micro_batches"] = float(passes)
    tokens = int(sum(len(d.tokens) for d in call.body.data))
    return ForwardBackwardResponse(
        loss=total_loss, stats=stats, num_data=len(call.body.data), num_tokens=tokens
    )


def forward_backward(
    registry: Registry, body: ForwardBackwardRequest, totals: CallTotals | None = None
) -> ForwardBackwardResponse:
    call = prepare(registry, body, call=totals)
    base, data = call.base, body.data
    st = CallStats()
    total_loss = 0.0
    budget = token_budget(base, body.micro_batch_tokens)
    groups = micro_batches(data, budget, base, critic=call.loss.trains == "critic")
    for idx in groups:
        ids, mask = inputs(base, data, idx)
        w = pad(base, data, idx, "weights")  # [B, T]
        mb = MicroBatch(base, call.adapter, data, idx, ids, mask, w, body.ppo.aggregation, call.norm)
        part = call.loss.micro_batch(mb, body, st)
        check_finite(call, part, [call.adapter])
        (part * body.loss_scale).backward()
        total_loss += float(part.detach())
    return finish(call, st, total_loss, len(groups))


def optim_step(registry: Registry, body: OptimStepRequest) -> OptimStepResponse:
    adapter = registry.get_adapter(body.adapter)
    if body.lr is not None:
        adapter.lr = body.lr
        for group in adapter.optimizer.param_groups:
            group["lr"] = body.lr
    grads = [p for p in adapter.params if p.grad is not None]
    if grads:
        max_norm = body.max_grad_norm if body.max_grad_norm is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
    else:
        norm = 0.0
    if not math.isfinite(norm):  # a step would make every weight NaN
        drop_gradients(adapter)
        raise BadRequest(
            f"adapter: {adapter.name!r}'s gradient norm is {norm}; the step was skipped and the "
            "gradients dropped, its weights are unchanged"
        )
    adapter.optimizer.step()
    adapter.optimizer.zero_grad(set_to_none=True)
    adapter.version += 1
    lora_batch.bump(adapter.name)
    return OptimStepResponse(adapter=adapter.name, version=adapter.version, grad_norm=norm, lr=adapter.lr)


def drop_gradients(adapter: Adapter) -> None:
    for p in adapter.params:
        p.grad = None
