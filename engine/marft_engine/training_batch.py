"""One forward and backward pass for several adapters of one base (`forward_backward_batch`).

Why: the trainer updates several agents in one iteration, and one forward_backward per adapter
runs N passes over small batches, each paying the per-pass costs (a Python walk over every layer,
small matmuls, padding to its own longest datum) on its own. Here the policy calls of one base are
cut into shared micro-batches (longest data first, so rows of similar length pad together), each
row goes through its own adapter's LoRA (lora_batch: `rows` with gradients), and each call's loss
is computed on its own rows with its own normalisers, loss scale and statistics, exactly as its
separate call would. Gradients reach only the adapter that computed a row, so every adapter gets
the gradient of its own call (within rounding: the matmuls run over other rows too); clipping and
the optimizer step stay per adapter (`optim_step`).

Calls that cannot share a pass (critics, whose value heads read hidden states, and calls on other
bases) run on their own, in order. Shapes: B = rows of a micro-batch, T = its longest row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from . import lora_batch, training
from .errors import BadRequest
from .registry import Adapter, Base, Registry
from .schemas import (
    Datum,
    ForwardBackwardBatch,
    ForwardBackwardBatchResponse,
    ForwardBackwardResponse,
)
from .training import Call, CallStats, MicroBatch, inputs, pad, prepare, token_scores

FUSABLE = frozenset({"ppo", "importance_sampling", "cross_entropy"})  # the policy losses


@dataclass
class Scored(MicroBatch):
    """One call's rows of a shared micro-batch, with their scores already computed by the shared
    pass: the loss functions read them through the same methods as a call's own micro-batch."""

    scores: tuple[torch.Tensor, torch.Tensor] | None = None  # (logp, entropy) [B_c, T_c], with grad
    ref: torch.Tensor | None = None  # reference logp [B_c, T_c]

    def policy_scores(self, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.scores is not None
        return self.scores

    def reference_logprobs(self, temperature: float) -> torch.Tensor:
        assert self.ref is not None
        return self.ref


@contextlib.contextmanager
def all_active(base: Base, adapters: list[Adapter]) -> Iterator[None]:
    """These adapters' LoRA weights require grad (each row then picks its own, lora_batch.rows)."""
    assert base.peft is not None
    base.peft.base_model.set_adapter(sorted({a.name for a in adapters}))
    base.peft.train(any(a.lora.dropout > 0 for a in adapters))
    try:
        yield
    finally:
        base.peft.eval()


def forward_backward_batch(registry: Registry, body: ForwardBackwardBatch) -> ForwardBackwardBatchResponse:
    calls = [prepare(registry, c, f"calls[{i}].") for i, c in enumerate(body.calls)]  # all checked first
    results: list[ForwardBackwardResponse | None] = [None] * len(calls)
    by_base: dict[str, list[int]] = {}
    for i, c in enumerate(calls):
        if c.body.loss in FUSABLE:
            by_base.setdefault(c.base.name, []).append(i)
    fused_passes = 0
    for group in by_base.values():
        if len(group) > 1 and lora_batch.rows_supported(calls[group[0]].base.hf):
            answers, passes = _fused(calls[group[0]].base, [calls[i] for i in group])
            fused_passes += passes
            for i, a in zip(group, answers, strict=True):
                results[i] = a
    for i, c in enumerate(calls):  # the rest, one at a time, in order
        if results[i] is None:
            results[i] = training.forward_backward(registry, c.body)
    return ForwardBackwardBatchResponse(
        results=[r for r in results if r is not None], fused_passes=fused_passes
    )


def _fused(base: Base, calls: list[Call]) -> tuple[list[ForwardBackwardResponse], int]:
    """The calls' data in shared micro-batches; returns each call's answer and the passes that
    carried rows of several calls."""
    items = [(c, i) for c, call in enumerate(calls) for i in range(len(call.body.data))]
    items.sort(key=lambda ci: -len(calls[ci[0]].body.data[ci[1]].tokens))  # longest first: less padding
    data: list[Datum] = [calls[c].body.data[i] for c, i in items]
    budget = training.token_budget(base, min(call.body.micro_batch_tokens for call in calls))
    groups = training.micro_batches(data, budget, base, critic=False)
    stats = [CallStats() for _ in calls]
    totals = [0.0] * len(calls)
    passes = [0] * len(calls)
    shared = 0
    with all_active(base, [call.adapter for call in calls]):
        for g in groups:
            g = sorted(g, key=lambda j: items[j][0])  # each call's rows together: one LoRA run per adapter
            rows_of: dict[int, list[int]] = {}  # call -> its rows in this micro-batch
            for r, j in enumerate(g):
                rows_of.setdefault(items[j][0], []).append(r)
            shared += len(rows_of) > 1
            ids, mask = inputs(base, data, g)  # [B, T]
            w = pad(base, data, g, "weights")  # [B, T]
            temps = torch.tensor([calls[items[j][0]].body.temperature for j in g], device=base.device)  # [B]
            names = [calls[items[j][0]].adapter.name for j in g]
            with lora_batch.rows(base.hf, names):
                logp, ent = token_scores(base, ids, mask, w, temps)  # [B, T] each, with grad
            ref = None
            if any(calls[c].body.loss == "ppo" and calls[c].body.ppo.kl_coef > 0 for c in rows_of):
                with torch.no_grad(), training.active(base, None):
                    ref = token_scores(base, ids, mask, w, temps)[0]  # [B, T]
                base.peft.base_model.set_adapter(sorted({call.adapter.name for call in calls}))  # type: ignore[union-attr]
            total: torch.Tensor | float = 0.0
            for c, rows in rows_of.items():
                call = calls[c]
                idx = [items[g[r]][1] for r in rows]  # the call's own data indices
                T = max(len(call.body.data[i].tokens) for i in idx)
                at = torch.tensor(rows, device=base.device)
                sub = Scored(
                    base,
                    call.adapter,
                    call.body.data,
                    idx,
                    ids[at, :T],
                    mask[at, :T],
                    w[at, :T],
                    call.body.ppo.aggregation,
                    call.norm,
                    scores=(logp[at, :T], ent[at, :T]),
                    ref=ref[at, :T] if ref is not None else None,
                )
                part = call.loss.micro_batch(sub, call.body, stats[c])
                training.check_finite(call, part, [k.adapter for k in calls])
                total = total + part * call.body.loss_scale
                totals[c] += float(part.detach())
                passes[c] += 1
            if isinstance(total, torch.Tensor):
                total.backward()
    if not all(passes):
        raise BadRequest("calls: a call had no rows in any pass")  # unreachable: every datum is in a group
    return [training.finish(call, stats[c], totals[c], passes[c]) for c, call in enumerate(calls)], shared
