"""The fused decode step (fused_decode.py, csrc/decode_layer.cpp) against Hugging Face's forward."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from helpers import PARITY_TOL, add_policy
from test_speculative import sample

from marft_engine import fused_decode, lora_batch, precision
from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate, SampleBatch, SampleRequest, SamplingParams

pytestmark = pytest.mark.skipif(not precision.panels_apply(), reason="no panel kernel on this CPU")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Whether each sampler model call took the fused step."""
    calls: list[bool] = []
    fused = fused_decode.logits

    def count(*a: object, **k: object) -> torch.Tensor | None:
        out = fused(*a, **k)  # type: ignore[arg-type]
        calls.append(out is not None)
        return out

    monkeypatch.setattr(fused_decode, "logits", count)
    yield calls


def _compare(
    engine: Engine, calls: list[bool], monkeypatch: pytest.MonkeyPatch, draft: int, temperature: float
) -> None:
    fused = sample(engine, draft, temperature, seed=5)
    took, steps = sum(calls), len(calls)
    calls.clear()
    monkeypatch.setattr(fused_decode, "ENABLED", False)
    plain = sample(engine, draft, temperature, seed=5)
    monkeypatch.setattr(fused_decode, "ENABLED", True)
    assert not any(calls)
    # the steps of one token a row, not the prefills (nor, with drafts, the steps that feed several)
    assert 5 < took < steps
    for x, y in zip(fused, plain, strict=True):
        assert x.response_ids == y.response_ids
        torch.testing.assert_close(
            torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=PARITY_TOL, rtol=0
        )


@pytest.mark.parametrize(("draft", "temperature"), [(0, 0.0), (0, 1.0), (4, 0.0)])
def test_sampling_fused_equals_sampling_through_the_model(
    engine: Engine, counted: list[bool], monkeypatch: pytest.MonkeyPatch, draft: int, temperature: float
) -> None:
    """Greedy and seeded, two adapters and the bare base in one batch, rows joining and leaving: the
    fused steps give the tokens Hugging Face's forward gives, log-probs within the parity tolerance."""
    _compare(engine, counted, monkeypatch, draft, temperature)


def test_a_base_with_biases_and_lora_on_some_layers(
    counted: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2 (biases on q, k and v) with adapters of different ranks on different projections, so
    some projections carry no LoRA and one adapter none on a projection another has."""
    from marft_engine.schemas import AdapterCreate, LoraConfig

    e = Engine(device="cpu", max_batch=64)
    try:
        e.create_base(BaseCreate(name="b", source="tiny:qwen2", seed=3, dtype="float32"))
        add_policy(e, "A", seed=1)
        e.create_adapter(
            AdapterCreate(
                name="B", base="b", lora=LoraConfig(r=2, alpha=4, target_modules=["q_proj", "up_proj"])
            )
        )
        with torch.no_grad():
            for p in e.adapters["B"].params:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)) * 0.5)
        lora_batch.bump()
        _compare(e, counted, monkeypatch, 0, 1.0)
    finally:
        e.close()


def test_new_adapter_weights_reach_the_next_call(
    engine: Engine, counted: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused layers hold the LoRA stacks of their rows: after a weight change between calls, the
    next call's fused steps agree with the model's forward on the new weights."""
    req = SampleRequest(
        adapter="A",
        base="b",
        prompt_ids=[5, 6, 7],
        sampling=SamplingParams(temperature=0.0, max_new_tokens=6),
    )

    def one() -> list[float]:
        return engine.sample(SampleBatch(requests=[req])).results[0].completions[0].logprobs

    before = one()
    saved = [p.detach().clone() for p in engine.adapters["A"].params]
    try:
        with torch.no_grad():
            for p in engine.adapters["A"].params:
                p.mul_(1.5)
        lora_batch.bump("A")
        after = one()
        assert any(counted)
        monkeypatch.setattr(fused_decode, "ENABLED", False)
        plain = one()
        assert after[1:] != before[1:]
        torch.testing.assert_close(torch.tensor(after), torch.tensor(plain), atol=PARITY_TOL, rtol=0)
    finally:
        with torch.no_grad():
            for p, s in zip(engine.adapters["A"].params, saved, strict=True):
                p.copy_(s)
        lora_batch.bump("A")


def test_a_lora_on_the_head_takes_the_model_forward(
    counted: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adapter with a LoRA on the LM head: the fused step does not apply (it runs the plain head),
    and sampling through the model gives what it gives with the fused step off."""
    from marft_engine.schemas import AdapterCreate, LoraConfig

    e = Engine(device="cpu", max_batch=64)
    try:
        e.create_base(BaseCreate(name="b", source="tiny:llama", seed=4, dtype="float32"))
        e.create_adapter(
            AdapterCreate(
                name="H", base="b", lora=LoraConfig(r=2, alpha=4, target_modules=["q_proj", "lm_head"])
            )
        )
        with torch.no_grad():
            for p in e.adapters["H"].params:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.5)
        lora_batch.bump()
        req = SampleRequest(
            adapter="H",
            base="b",
            prompt_ids=[1, 2, 3],
            sampling=SamplingParams(temperature=0.0, max_new_tokens=5),
        )
        on = e.sample(SampleBatch(requests=[req])).results[0].completions[0]
        assert counted and not any(counted)
        monkeypatch.setattr(fused_decode, "ENABLED", False)
        off = e.sample(SampleBatch(requests=[req])).results[0].completions[0]
        assert on.response_ids == off.response_ids and on.logprobs == off.logprobs
    finally:
        e.close()
