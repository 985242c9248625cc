"""Forward and training passes (training.py) on the tiny model: isolation, the reference, gradient
accumulation, the LM head on weighted positions only, critic values."""

from __future__ import annotations

import typing

import pytest
import torch
from helpers import add_policy, ppo_data, seqs, snapshot

from marft_engine import losses, training
from marft_engine.engine import Engine
from marft_engine.errors import EngineError
from marft_engine.models import load_tiny
from marft_engine.schemas import (
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    OptimStepRequest,
    PPOConfig,
)
from marft_engine.training import LOSSES


def test_adapter_isolation(engine: Engine) -> None:
    before = snapshot(engine)
    ids_a = {id(p) for p in engine.adapters["A"].params}
    names_a = {n for n, p in engine.bases["b"].hf.named_parameters() if id(p) in ids_a}
    assert names_a
    engine.forward_backward(ForwardBackwardRequest(adapter="A", loss="ppo", data=ppo_data(engine, "A", 1)))
    engine.optim_step(OptimStepRequest(adapter="A"))
    after = snapshot(engine)
    for n in before:
        if n in names_a:
            continue
        assert torch.equal(before[n], after[n]), f"{n} changed by a step on A"
    assert any(not torch.equal(before[n], after[n]) for n in names_a), "A did not change"
    # and the same for a critic step
    before = after
    data = [Datum(tokens=s, returns=[1.0] * len(s), old_values=[0.0] * len(s)) for s in seqs(3, 5)]
    engine.forward_backward(ForwardBackwardRequest(adapter="C", loss="value", data=data))
    engine.optim_step(OptimStepRequest(adapter="C"))
    after = snapshot(engine)
    ids_c = {id(p) for p in engine.adapters["C"].params}
    names_c = {n for n, p in engine.bases["b"].hf.named_parameters() if id(p) in ids_c}
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= names_c | {n for n in before if n.startswith("C.head.")}


def test_reference_is_the_plain_base_model(engine: Engine) -> None:
    plain, _ = load_tiny("llama", 0)
    data = seqs(3, 7)
    res = engine.forward(
        ForwardRequest(adapter="__base__", base="b", data=[Datum(tokens=s) for s in data], temperature=0.7)
    )
    for s, r in zip(data, res.results, strict=True):
        ids = torch.tensor([s])
        with torch.no_grad():
            expect = losses.logprobs_and_entropies(plain(ids).logits, ids, 0.7)[0][0]
        assert torch.allclose(torch.tensor(r.logprobs), expect, atol=1e-6)
        assert r.logprobs[0] == 0.0
    # ...and an adapter really differs from it
    other = engine.forward(ForwardRequest(adapter="B", data=[Datum(tokens=data[0])], temperature=0.7))
    assert (
        max(abs(x - y) for x, y in zip(other.results[0].logprobs, res.results[0].logprobs, strict=True))
        > 1e-3
    )


def test_microbatch_accumulation_equals_full_batch(engine: Engine) -> None:
    add_policy(engine, "acc", seed=9)
    data = ppo_data(engine, "acc", 31, n=7)
    params = engine.adapters["acc"].params

    def grads(**kw: object) -> list[torch.Tensor]:
        engine.forward_backward(ForwardBackwardRequest(adapter="acc", data=data, **kw))  # type: ignore[arg-type]
        g = [p.grad.clone() for p in params]
        engine.adapters["acc"].optimizer.zero_grad(set_to_none=True)
        return g

    for cfg in (
        PPOConfig(),
        PPOConfig(aggregation="token-sum", entropy_coef=0.01, kl_coef=0.1),
        PPOConfig(ratio="sequence", sequence_logprob="mean"),
    ):
        full = grads(loss="ppo", ppo=cfg, micro_batch_tokens=100000)
        small = grads(loss="ppo", ppo=cfg, micro_batch_tokens=20)
        for a, b in zip(full, small, strict=True):
            # fp32 sums in another order: equal up to rounding, relative to the gradient's scale
            assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max()), cfg
        assert sum(float(g.abs().sum()) for g in full) > 0
    r1 = engine.forward_backward(
        ForwardBackwardRequest(adapter="acc", loss="cross_entropy", data=data, micro_batch_tokens=20)
    )
    assert r1.stats["micro_batches"] >= 4
    engine.adapters["acc"].optimizer.zero_grad(set_to_none=True)
    # value loss on the critic
    vdata = [Datum(tokens=d.tokens, returns=d.advantages, old_values=[0.1] * len(d.tokens)) for d in data]
    cparams = engine.adapters["C"].params
    out = []
    for budget in (100000, 20):
        engine.forward_backward(
            ForwardBackwardRequest(adapter="C", loss="value", data=vdata, micro_batch_tokens=budget)
        )
        out.append([p.grad.clone() for p in cparams])
        engine.adapters["C"].optimizer.zero_grad(set_to_none=True)
    for a, b in zip(*out, strict=True):
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    engine.delete_adapter("acc")


def test_critic_values_are_per_prefix(engine: Engine) -> None:
    s = seqs(1, 3, 10, 11)[0]
    full = engine.forward(ForwardRequest(adapter="C", data=[Datum(tokens=s)])).results[0].values
    assert full is not None and len(full) == len(s)
    for i in (2, 6):
        part = engine.forward(ForwardRequest(adapter="C", data=[Datum(tokens=s[: i + 1])])).results[0].values
        assert part is not None and part[-1] == pytest.approx(full[i], abs=1e-5)


def test_head_on_weighted_positions_only_equals_full_logits(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss runs the LM head only where weights > 0 (prompts cost no vocabulary-wide work);
    the loss, its stats and its gradient equal the full-logits computation's."""
    add_policy(engine, "sel", seed=12)
    params = engine.adapters["sel"].params
    data = ppo_data(engine, "sel", 41, n=5)
    # Only the second half of each sequence is an action (weight 1), as in a prompt + response.
    data = [
        d.model_copy(
            update={"weights": [0.0 if t < len(d.tokens) // 2 else 1.0 for t in range(len(d.tokens))]}
        )
        for d in data
    ]
    cfg = PPOConfig(entropy_coef=0.01, kl_coef=0.1)

    def run() -> tuple[float, dict[str, float], list[torch.Tensor]]:
        r = engine.forward_backward(ForwardBackwardRequest(adapter="sel", loss="ppo", data=data, ppo=cfg))
        g = [p.grad.clone() for p in params]
        engine.adapters["sel"].optimizer.zero_grad(set_to_none=True)
        return r.loss, r.stats, g

    fast = run()
    monkeypatch.setattr(training, "HEAD_ROWS", 4)  # the head over 4 positions at a time
    chunked = run()
    assert engine.bases["b"].plain_head  # tiny:llama takes the selective path...
    monkeypatch.setattr(engine.bases["b"], "plain_head", False)  # ...and now the full-logits one
    full = run()
    scored = sum(1 for d in data for w in (d.weights or [])[1:] if w > 0)
    assert scored > 2 * training.HEAD_ROWS  # several pieces
    for part in (fast, chunked):
        assert part[0] == pytest.approx(full[0], rel=1e-5, abs=1e-7)
        for k in ("entropy", "kl_ref", "approx_kl", "clipfrac"):
            assert part[1][k] == pytest.approx(full[1][k], rel=1e-4, abs=1e-7), k
        for a, b in zip(part[2], full[2], strict=True):
            assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())
    assert sum(float(g.abs().sum()) for g in fast[2]) > 0
    engine.delete_adapter("sel")


def test_forward_with_weights_computes_only_those_positions(engine: Engine) -> None:
    toks = seqs(3, 123, 8, 14)
    full = engine.forward(ForwardRequest(adapter="A", data=[Datum(tokens=t) for t in toks])).results
    w = [[0.0] * (len(t) // 2) + [1.0] * (len(t) - len(t) // 2) for t in toks]
    part = engine.forward(
        ForwardRequest(adapter="A", data=[Datum(tokens=t, weights=x) for t, x in zip(toks, w, strict=True)])
    ).results
    for f, p, x in zip(full, part, w, strict=True):
        assert f.logprobs is not None and p.logprobs is not None
        for a, b, wt in zip(f.logprobs, p.logprobs, x, strict=True):
            assert (b == pytest.approx(a, abs=1e-5)) if wt > 0 else b == 0.0


def test_the_loss_table_covers_the_protocol(engine: Engine) -> None:
    assert set(LOSSES) == set(typing.get_args(ForwardBackwardRequest.model_fields["loss"].annotation))
    data = [Datum(tokens=s, returns=[1.0] * len(s)) for s in seqs(2, 3)]
    for name, loss in LOSSES.items():  # each loss trains the adapter kind its entry names, only that
        other = "A" if loss.trains == "critic" else "C"
        with pytest.raises(EngineError, match=f"needs a {loss.trains} adapter"):
            engine.forward_backward(ForwardBackwardRequest(adapter=other, loss=name, data=data))  # type: ignore[arg-type]


def test_a_cpu_training_micro_batch_keeps_its_widest_activation_within_the_cap(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU, a training call's micro-batches hold at most CPU_ACTIVATION_BYTES of the widest layer
    (fp32), whatever the call's budget; a smaller budget still wins; the gradients are the uncapped
    call's. The tiny model's cap is far above any budget."""
    base = engine.bases["b"]
    assert training.token_budget(base, 8192) == 8192
    add_policy(engine, "cap", seed=13)
    params = engine.adapters["cap"].params
    data = ppo_data(engine, "cap", 51, n=8)

    def run() -> tuple[float, list[torch.Tensor]]:
        r = engine.forward_backward(ForwardBackwardRequest(adapter="cap", loss="ppo", data=data))
        g = [p.grad.clone() for p in params]
        engine.adapters["cap"].optimizer.zero_grad(set_to_none=True)
        return r.stats["micro_batches"], g

    whole = run()
    cfg = base.hf.config
    widest = max(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim)
    monkeypatch.setattr(training, "CPU_ACTIVATION_BYTES", 4 * widest * 30)  # 30 tokens
    assert training.token_budget(base, 8192) == 30
    assert training.token_budget(base, 20) == 20
    capped = run()
    assert whole[0] == 1 and capped[0] > 2
    for a, b in zip(capped[1], whole[1], strict=True):  # fp32 sums in another order
        assert float((a - b).norm()) <= 1e-4 * float(b.norm())
    engine.delete_adapter("cap")
