"""Passes over a micro-batch's real tokens only (unpad.py): the same losses, stats, gradients,
log-probs and values as the padded passes, within fp32 rounding, for every loss, one adapter or
several in a shared pass, fp32 and bf16; and the trunk really sees only the real tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import torch
from helpers import PARITY_TOL, TARGETS, add_policy, perturb, ppo_data, seqs
from test_speculative import sample
from transformers import AutoConfig

from marft_engine import fused_decode, lora_batch, unpad
from marft_engine.engine import Engine
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    Datum,
    ForwardBackwardBatch,
    ForwardBackwardRequest,
    ForwardRequest,
    LoraConfig,
    PPOConfig,
    SampleBatch,
    SampleRequest,
    SamplingParams,
    ValueConfig,
)

T = TypeVar("T")


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def eng(request: pytest.FixtureRequest) -> Iterator[Engine]:
    e = Engine(device="cpu", max_batch=64)
    e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype=request.param))
    add_policy(e, "A", seed=1)
    add_policy(e, "B", seed=2)
    e.create_adapter(
        AdapterCreate(
            name="C", base="b", kind="critic", lora=LoraConfig(r=4, alpha=8, target_modules=TARGETS), seed=3
        )
    )
    perturb(e, "C", 1003, scale=0.1)
    yield e
    e.close()


def calls(e: Engine) -> list[ForwardBackwardRequest]:
    """Rows of 5 to 19 tokens: PPO with a KL term, cross-entropy, and a critic's value loss."""
    value_data = [Datum(tokens=d.tokens, returns=[0.5] * len(d.tokens)) for d in ppo_data(e, "A", 50, n=5)]
    return [
        ForwardBackwardRequest(
            adapter="A", loss="ppo", data=ppo_data(e, "A", 51), ppo=PPOConfig(kl_coef=0.1)
        ),
        ForwardBackwardRequest(adapter="B", loss="cross_entropy", data=ppo_data(e, "B", 52, n=4)),
        ForwardBackwardRequest(adapter="C", loss="value", data=value_data, value=ValueConfig(clip=None)),
    ]


def grads(e: Engine) -> dict[str, list[torch.Tensor]]:
    out = {n: [p.grad.clone() for p in a.params if p.grad is not None] for n, a in e.adapters.items()}
    for a in e.adapters.values():
        a.optimizer.zero_grad(set_to_none=True)
    return out


def both_ways(fn: Callable[[], T]) -> tuple[T, T]:
    """fn() padded, then over real tokens only."""
    unpad.ENABLED = False
    try:
        padded = fn()
    finally:
        unpad.ENABLED = True
    return padded, fn()


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    # products over N rows where there were B x T sum in another order; bf16 rounds at 2^-8. A row
    # attending across its neighbours, or a lost token, is O(1).
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    return float((got - want).norm()) <= tol * float(want.norm()) + 1e-9


def test_each_loss_gives_the_gradients_of_the_padded_pass(eng: Engine) -> None:
    dtype = eng.bases["b"].dtype
    grads(eng)
    for c in calls(eng):
        (r0, g0), (r1, g1) = both_ways(lambda c=c: (eng.forward_backward(c), grads(eng)))
        assert r1.loss == pytest.approx(r0.loss, rel=1e-5 if dtype == torch.float32 else 1e-2, abs=1e-6)
        assert g0[c.adapter] and len(g0[c.adapter]) == len(g1[c.adapter])
        for g, w in zip(g1[c.adapter], g0[c.adapter], strict=True):
            assert close(g, w, dtype), c.loss


def test_a_shared_pass_over_several_adapters_too(eng: Engine) -> None:
    dtype = eng.bases["b"].dtype
    cs = calls(eng)[:2]  # A and B: runs of rows of two adapters, cut into their tokens
    grads(eng)
    (o0, g0), (o1, g1) = both_ways(
        lambda: (eng.forward_backward_batch(ForwardBackwardBatch(calls=cs)), grads(eng))
    )
    assert o1.fused_passes >= 1
    for name in ("A", "B"):
        for g, w in zip(g1[name], g0[name], strict=True):
            assert close(g, w, dtype), name
    for a, b in zip(o1.results, o0.results, strict=True):
        assert a.loss == pytest.approx(b.loss, rel=1e-5 if dtype == torch.float32 else 1e-2, abs=1e-6)


def test_forward_gives_the_log_probs_and_values_of_the_padded_pass(eng: Engine) -> None:
    data = [Datum(tokens=d.tokens) for d in ppo_data(eng, "A", 53, n=7)]
    tol = 1e-5 if eng.bases["b"].dtype == torch.float32 else 2e-2
    for adapter, field in (("A", "logprobs"), ("C", "values")):
        r0, r1 = both_ways(lambda a=adapter: eng.forward(ForwardRequest(adapter=a, data=data)).results)
        for a, b, d in zip(r1, r0, data, strict=True):
            got, want = torch.tensor(getattr(a, field)), torch.tensor(getattr(b, field))
            assert got.shape == want.shape == (len(d.tokens),)
            assert torch.allclose(got, want, rtol=tol, atol=tol), field


def test_a_mixed_prefill_takes_each_adapters_lora_over_its_own_rows(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts of several lengths, their adapters interleaved: A, B, the bare base, and D with LoRA on
    two projections only. The prefill puts each adapter's rows side by side and takes each run through
    its own LoRA block only (lora_batch._add_runs), one run per adapter; every row gets forward's
    log-probs for its own adapter, prompt and tokens (a row through another row's block, or a row's
    result returned to another request, is off by the adapters' difference). The padded pass through
    Hugging Face's forward, which a prefill takes where the fused one (fused_decode.prefill) does not."""
    monkeypatch.setattr(fused_decode, "PREFILL_ENABLED", False)
    eng.create_adapter(
        AdapterCreate(
            name="D", base="b", lora=LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]), seed=4
        )
    )
    perturb(eng, "D", 1004)
    runs: list[list[str]] = []
    add_runs = lora_batch._add_runs

    def counted(*args: torch.Tensor) -> torch.Tensor:
        runs.append([a for a, _, _ in lora_batch._runs()])
        return add_runs(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(lora_batch, "_add_runs", counted)
    try:
        adapters = ["A", "B", "__base__", "D", "A", "B", "D", "__base__"]
        sp = SamplingParams(temperature=1.0, max_new_tokens=3, ignore_eos=True)
        reqs = [
            SampleRequest(adapter=a, base="b", prompt_ids=p, sampling=sp, seed=i)
            for i, (a, p) in enumerate(zip(adapters, seqs(len(adapters), 31, 3, 14), strict=True))
        ]
        out = eng.sample(SampleBatch(requests=reqs)).results
        assert runs and all(r == ["A", "B", "D", "__base__"] for r in runs)
        tol = PARITY_TOL if eng.bases["b"].dtype == torch.float32 else 2e-2
        for req, res in zip(reqs, out, strict=True):
            assert res.adapter == req.adapter and res.prompt_ids == req.prompt_ids
            c = res.completions[0]
            f = eng.forward(
                ForwardRequest(
                    adapter=req.adapter, base="b", data=[Datum(tokens=res.prompt_ids + c.response_ids)]
                )
            )
            want = torch.tensor(f.results[0].logprobs[len(res.prompt_ids) :])
            torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=tol, rtol=0)
    finally:
        eng.delete_adapter("D")


def test_the_trunk_sees_only_real_tokens(eng: Engine) -> None:
    """One row of all the real tokens, each at its own position; rows of one length stay padded-free
    as they were (no layout)."""
    seen: list[tuple[int, ...]] = []
    emb = eng.bases["b"].hf.get_input_embeddings()
    hook = emb.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    try:
        uneven = [Datum(tokens=[1, 2, 3]), Datum(tokens=[4, 5, 6, 7, 8]), Datum(tokens=[9, 10])]
        eng.forward(ForwardRequest(adapter="A", data=uneven))
        even = [Datum(tokens=[1, 2, 3]), Datum(tokens=[4, 5, 6])]
        eng.forward(ForwardRequest(adapter="A", data=even))
    finally:
        hook.remove()
    assert seen == [(1, 10), (2, 3)]
    assert unpad.layout() is None  # cleared after the pass


def test_a_row_does_not_see_its_neighbours() -> None:
    """A row's log-probs alone equal its log-probs beside others of other lengths."""
    e = Engine(device="cpu", max_batch=8)
    try:
        e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32"))
        add_policy(e, "A", seed=1)
        row = Datum(tokens=[5, 9, 11, 2, 7, 30])
        alone = e.forward(ForwardRequest(adapter="A", data=[row])).results[0].logprobs
        among = (
            e.forward(ForwardRequest(adapter="A", data=[Datum(tokens=[1] * 9), row, Datum(tokens=[3, 4])]))
            .results[1]
            .logprobs
        )
        assert alone[1:] == pytest.approx(among[1:], abs=1e-5)
    finally:
        e.close()


def test_it_applies_only_where_every_layer_attends_over_the_whole_row() -> None:
    llama = AutoConfig.for_model("llama")
    assert unpad.applies(llama)
    mistral = AutoConfig.for_model("mistral", sliding_window=64)
    assert not unpad.applies(mistral)
    gemma = AutoConfig.for_model("gemma3_text")  # sliding-window layers between global ones
    assert not unpad.applies(gemma)
    full = AutoConfig.for_model("gemma3_text", layer_types=["full_attention"] * 4, num_hidden_layers=4)
    assert unpad.applies(full)


@pytest.mark.parametrize("cache_mb", [0, 4])
def test_a_prefill_over_real_tokens_samples_what_a_padded_one_does(
    cache_mb: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts of several lengths over two adapters and the bare base, greedy and seeded, with and
    without drafts, joins and leaves; with the prefix cache, prefills after cached columns too. The
    same tokens, log-probs within the parity tolerance, and the prefills took real tokens only. The
    padded pass, which a prefill takes where the fused one (fused_decode.prefill) does not."""
    monkeypatch.setattr(fused_decode, "PREFILL_ENABLED", False)
    e = Engine(device="cpu", max_batch=64)
    try:
        e.create_base(
            BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32", prefix_cache_mb=cache_mb)
        )
        add_policy(e, "A", seed=1)
        add_policy(e, "B", seed=2)
        packed: list[bool] = []
        after_cache: list[bool] = []  # real-only prefills after cached columns
        prefill = unpad.prefill

        def counted(
            model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor
        ) -> object:
            out = prefill(model, ids, mask, pos)
            packed.append(out is not None)
            after_cache.append(out is not None and mask.shape[1] > ids.shape[1])
            return out

        monkeypatch.setattr(unpad, "prefill", counted)
        for draft, temperature in [(0, 0.0), (0, 1.0), (4, 0.0)]:
            # each run from an empty prefix cache: else a run's prompts are cached to their last
            # token, which a one-token step then computes (no prefill to pack)
            e.sampler.prefix.clear()
            real = sample(e, draft, temperature, seed=7)
            assert any(packed)
            packed.clear()
            monkeypatch.setattr(unpad, "ENABLED", False)
            e.sampler.prefix.clear()
            padded = sample(e, draft, temperature, seed=7)
            monkeypatch.setattr(unpad, "ENABLED", True)
            assert not any(packed)
            for x, y in zip(real, padded, strict=True):
                assert x.response_ids == y.response_ids
                torch.testing.assert_close(
                    torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=PARITY_TOL, rtol=0
                )
        assert any(after_cache) == bool(cache_mb)
    finally:
        e.close()
