"""The fused decode step (fused_decode.py, csrc/decode_layer.cpp) against Hugging Face's forward."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from helpers import PARITY_TOL, add_policy, applied, perturb
from test_speculative import sample

from marft_engine import decode_attention, fused_decode, lora_batch, precision
from marft_engine.engine import Engine
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    LoraConfig,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)

pytestmark = pytest.mark.skipif(not precision.panels_apply(), reason="no panel kernel on this CPU")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each sampler model call took the fused step."""
    return applied(monkeypatch, fused_decode, "logits")


@contextlib.contextmanager
def _engine_with(source: str, seed: int, adapter: str, targets: list[str]) -> Iterator[Engine]:
    """An engine on a tiny base with one random adapter of rank 2 on `targets`, closed after."""
    e = Engine(device="cpu", max_batch=64)
    try:
        e.create_base(BaseCreate(name="b", source=source, seed=seed, dtype="float32"))
        e.create_adapter(
            AdapterCreate(name=adapter, base="b", lora=LoraConfig(r=2, alpha=4, target_modules=targets))
        )
        perturb(e, adapter, seed + 100)
        yield e
    finally:
        e.close()


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
    with _engine_with("tiny:qwen2", 3, "B", ["q_proj", "up_proj"]) as e:
        add_policy(e, "A", seed=1)
        _compare(e, counted, monkeypatch, 0, 1.0)


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
    with _engine_with("tiny:llama", 4, "H", ["q_proj", "lm_head"]) as e:
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


def test_sdpa_asked_for_takes_the_model_forward(
    engine: Engine, counted: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MARFT_DECODE_KERNEL=0 (decode_attention.ENABLED off) asks for SDPA's attention, which only the
    model's forward has: no step is fused."""
    monkeypatch.setattr(decode_attention, "ENABLED", False)
    sample(engine, 0, 0.0, seed=2)
    assert counted and not any(counted)
