"""The fused decode step (fused_decode.py, csrc/decode_layer.cpp) against Hugging Face's forward."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator

import pytest
import torch
from helpers import PARITY_TOL, add_policy, applied, perturb
from test_speculative import prompts, sample

from marft_engine import decode_attention, fused_decode, lora_batch, precision
from marft_engine.engine import Engine
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    Completion,
    Datum,
    ForwardRequest,
    LoraConfig,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)

fp32_panels = pytest.mark.skipif(not precision.panels_apply(), reason="no fp32 panels on this CPU")
bf16_panels = pytest.mark.skipif(not precision.bf16_panels_apply(), reason="no bf16 panels on this CPU")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each sampler model call took the fused step."""
    return applied(monkeypatch, fused_decode, "logits")


@pytest.fixture
def prefilled(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each sampler prefill pass was fused."""
    return applied(monkeypatch, fused_decode, "prefill")


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
    engine: Engine,
    calls: list[bool],
    monkeypatch: pytest.MonkeyPatch,
    draft: int,
    temperature: float,
    before_each: Callable[[], None] = lambda: None,
) -> None:
    prefills = applied(monkeypatch, fused_decode, "prefill")
    before_each()
    fused = sample(engine, draft, temperature, seed=5)
    took, steps = sum(calls), len(calls)
    assert prefills and all(prefills)  # every prefill pass fused too
    calls.clear()
    prefills.clear()
    monkeypatch.setattr(fused_decode, "ENABLED", False)
    before_each()
    plain = sample(engine, draft, temperature, seed=5)
    monkeypatch.setattr(fused_decode, "ENABLED", True)
    assert not any(calls) and not any(prefills)
    # the steps of one token a row (with drafts, not the steps that feed several)
    assert 5 < took <= steps and (draft == 0 or took < steps)
    for x, y in zip(fused, plain, strict=True):
        assert x.response_ids == y.response_ids
        torch.testing.assert_close(
            torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=PARITY_TOL, rtol=0
        )


@fp32_panels
@pytest.mark.parametrize(("draft", "temperature"), [(0, 0.0), (0, 1.0), (4, 0.0)])
def test_sampling_fused_equals_sampling_through_the_model(
    engine: Engine, counted: list[bool], monkeypatch: pytest.MonkeyPatch, draft: int, temperature: float
) -> None:
    """Greedy and seeded, two adapters and the bare base in one batch, rows joining and leaving: the
    fused steps give the tokens Hugging Face's forward gives, log-probs within the parity tolerance."""
    _compare(engine, counted, monkeypatch, draft, temperature)


@fp32_panels
def test_prefills_after_cached_prefixes_equal_the_model_prefills(
    counted: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the prefix cache: the second call's prompts start with the first's, so its fused prefills
    run after cached columns of several lengths (and padding between them and the new tokens); each
    run starts from an empty cache, and gives what the model's forward gives."""
    e = Engine(device="cpu", max_batch=64)
    try:
        e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32", prefix_cache_mb=4))
        add_policy(e, "A", seed=1)
        add_policy(e, "B", seed=2)
        _compare(e, counted, monkeypatch, 0, 1.0, before_each=e.sampler.prefix.clear)
        assert e.stats({}).prefix_cache.hit_tokens > 0
    finally:
        e.close()


@fp32_panels
def test_a_base_with_biases_and_lora_on_some_layers(
    counted: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2 (biases on q, k and v) with adapters of different ranks on different projections, so
    some projections carry no LoRA and one adapter none on a projection another has."""
    with _engine_with("tiny:qwen2", 3, "B", ["q_proj", "up_proj"]) as e:
        add_policy(e, "A", seed=1)
        _compare(e, counted, monkeypatch, 0, 1.0)


@fp32_panels
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


@fp32_panels
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


@fp32_panels
def test_sdpa_asked_for_takes_the_model_forward(
    engine: Engine, counted: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MARFT_DECODE_KERNEL=0 (decode_attention.ENABLED off) asks for SDPA's attention, which only the
    model's forward has: no step is fused."""
    monkeypatch.setattr(decode_attention, "ENABLED", False)
    sample(engine, 0, 0.0, seed=2)
    assert counted and not any(counted)


@bf16_panels
def test_bf16_fused_steps_are_as_close_to_fp32_as_the_model_step(
    counted: list[bool], prefilled: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bf16 base (bf16 panels): the fused prefills' and steps' log-probs are within bf16 rounding of an fp32 pass
    over the same bf16 weights, and closer to it than the model's own bf16 step (whose products round
    their outputs to bf16), for greedy and seeded sampling, two adapters and the bare base, rows
    joining and leaving."""
    e16, e32 = Engine(device="cpu", max_batch=64), Engine(device="cpu", max_batch=64)
    try:
        # with the prefix cache: the second call's prefills run after cached columns
        _bf16_beside_fp32(e16, e32, monkeypatch, {"A": 1, "B": 2}, prefix_cache_mb=4)
        for temperature in (0.0, 1.0):
            e16.sampler.prefix.clear()
            fused = sample(e16, 0, temperature, seed=5)
            assert 5 < sum(counted) and prefilled and all(prefilled)
            counted.clear()
            prefilled.clear()
            monkeypatch.setattr(fused_decode, "ENABLED", False)
            e16.sampler.prefix.clear()
            plain = sample(e16, 0, temperature, seed=5)
            monkeypatch.setattr(fused_decode, "ENABLED", True)
            assert not any(counted) and not any(prefilled)
            counted.clear()
            prefilled.clear()
            gaps = {}
            for side, out in (("fused", fused), ("model", plain)):
                gaps[side] = _gaps_to_fp32(e32, out, temperature)
            assert statistics.mean(gaps["fused"]) < 0.01 and max(gaps["fused"]) < 0.2, gaps["fused"]
            assert statistics.mean(gaps["fused"]) < statistics.mean(gaps["model"]), gaps
        assert e16.stats({}).prefix_cache.hit_tokens > 0
    finally:
        e16.close()
        e32.close()


def _bf16_beside_fp32(
    e16: Engine,
    e32: Engine,
    monkeypatch: pytest.MonkeyPatch,
    adapters: dict[str, int],
    prefix_cache_mb: int = 0,
    perturbed: bool = False,
) -> None:
    """Base "b" of the tiny Llama on e16 in bf16, and on e32 in fp32 over the same weights rounded to
    bf16 (no packed copies); the adapters {name: seed} on both (first perturbed on e16, where asked),
    e32's a copy of e16's."""
    e16.create_base(
        BaseCreate(name="b", source="tiny:llama", seed=0, dtype="bfloat16", prefix_cache_mb=prefix_cache_mb)
    )
    with monkeypatch.context() as m:
        m.setattr(precision, "pack_weight", lambda w, bias=None: None)
        e32.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32"))
    with torch.no_grad():
        for mod in e32.bases["b"].hf.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(mod.weight.to(torch.bfloat16))
    for name, seed in adapters.items():
        for e in (e16, e32):
            add_policy(e, name, seed=seed)
        if perturbed:
            perturb(e16, name, seed + 10)
        with torch.no_grad():
            for p, q in zip(e16.adapters[name].params, e32.adapters[name].params, strict=True):
                q.copy_(p)
    lora_batch.bump()


def _gaps_to_fp32(e32: Engine, out: list[Completion], temperature: float) -> list[float]:
    """|log-prob - the fp32 engine's forward log-prob| of every sampled token of `sample`'s rows of
    adapters A and B (the bare base's rows are left out: forward takes an adapter)."""
    gaps = []
    rows = [(p, ["A", "B", "__base__"][i % 3]) for c in range(2) for i, (p, _) in enumerate(prompts(5 + c))]
    for (prompt, adapter), c in zip(rows, out, strict=True):
        if adapter == "__base__":
            continue
        req = ForwardRequest(
            adapter=adapter,
            data=[Datum(tokens=prompt + c.response_ids)],
            temperature=temperature if temperature > 0 else 1.0,
        )
        ref = e32.forward(req).results[0].logprobs[len(prompt) :]
        gaps += [abs(a - b) for a, b in zip(c.logprobs, ref, strict=True)]
    return gaps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_prefill_after_cached_columns_equals_each_prompt_alone(dtype: str) -> None:
    """`fused_decode.prefill` over four prompts side by side (two adapters and the bare base), three of
    them after cached prefixes of different lengths: so padding before a short prompt's columns and
    between a prefix and its new tokens. Each prompt gets the logits and new keys and values of its own
    prefill alone from its first token, whose keys and values the cached columns hold: the layout, the
    masks and the cached columns are right to within the order of fp32 sums (bf16 keys and values:
    within a rounding)."""
    if not (precision.panels_apply() if dtype == "float32" else precision.bf16_panels_apply()):
        pytest.skip(f"no {dtype} panels on this CPU")
    e = Engine(device="cpu", max_batch=64)
    try:
        e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype=dtype))
        for name, seed in (("A", 1), ("B", 2)):
            add_policy(e, name, seed=seed)
            perturb(e, name, seed + 10)
        base = e.bases["b"]
        adapters = ["A", "B", "__base__", "A"]
        prompts = [list(range(3, 40)), list(range(50, 62)), list(range(70, 101)), list(range(9, 30))]
        starts = [20, 0, 7, 16]  # tokens each has cached
        with torch.no_grad(), base.autocast():
            alone = []  # each prompt's prefill alone: logits [1, V], keys and values [1, Hk, len, D]
            for a, p in zip(adapters, prompts, strict=True):
                one = fused_decode.prefill(base.hf, [a], [p], [0], None)
                assert one is not None
                alone.append(one)
            k0 = alone[0][1][0][0]
            C = max(starts)
            # the cached prefixes, right-aligned: [layers, 4, Hk, C, D] each
            shape = (len(alone[0][1]), 4, k0.shape[1], C, k0.shape[3])
            past = (k0.new_zeros(shape), k0.new_zeros(shape))
            for i, c in enumerate(starts):
                for li, (k, v) in enumerate(alone[i][1]):
                    past[0][li, i, :, C - c :], past[1][li, i, :, C - c :] = k[0, :, :c], v[0, :, :c]
            new = [p[c:] for p, c in zip(prompts, starts, strict=True)]
            out = fused_decode.prefill(base.hf, adapters, new, starts, past)
        assert out is not None
        logits, kv = out
        L = kv[0][0].shape[2]
        assert L == C + max(len(t) for t in new)
        tol = 1e-4 if dtype == "float32" else 1e-2

        def close(x: torch.Tensor, y: torch.Tensor) -> None:
            torch.testing.assert_close(x.float(), y.float(), atol=tol, rtol=tol)

        for i, (t, c) in enumerate(zip(new, starts, strict=True)):
            close(logits[i], alone[i][0][0])
            for (k, v), (k1, v1) in zip(kv, alone[i][1], strict=True):
                close(k[i, :, L - len(t) :], k1[0, :, c:])
                close(v[i, :, L - len(t) :], v1[0, :, c:])
                assert torch.equal(k[i, :, C - c : C], k1[0, :, :c])  # the cached columns, as given
    finally:
        e.close()


def test_bf16_prefill_attention_over_many_blocks_and_chunks_is_within_bf16_of_fp32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bf16 base's fused prefill attends on the bf16 panels (decode_layer.cpp,
    `prefill_attention_bf16`). Two long prompts side by side, one after a cached prefix: many blocks
    of query positions, and for the longer one scores over several chunks of blocks. Each prompt's
    next-token log-probs are within bf16 rounding of an fp32 forward over the same bf16 weights, and
    closer to it than the model's own bf16 forward is plus a margin."""
    if not precision.bf16_panels_apply():
        pytest.skip("no bf16 panels on this CPU")
    e16, e32 = Engine(device="cpu", max_batch=64), Engine(device="cpu", max_batch=64)
    try:
        _bf16_beside_fp32(e16, e32, monkeypatch, {"A": 1}, perturbed=True)
        g = torch.Generator().manual_seed(3)
        vocab = e16.bases["b"].hf.config.vocab_size
        prompts = [torch.randint(3, vocab - 8, (n,), generator=g).tolist() for n in (1000, 300)]
        base16 = e16.bases["b"]
        with torch.no_grad(), base16.autocast():
            # the second prompt's first 120 tokens cached: its keys and values from its own prefill
            head = fused_decode.prefill(base16.hf, ["A"], [prompts[1][:120]], [0], None)
            assert head is not None
            C = 120
            past = (
                torch.stack([k for k, _ in head[1]]).new_zeros(len(head[1]), 2, *head[1][0][0].shape[1:]),
                torch.stack([v for _, v in head[1]]).new_zeros(len(head[1]), 2, *head[1][0][1].shape[1:]),
            )
            for li, (k, v) in enumerate(head[1]):
                past[0][li, 1], past[1][li, 1] = k[0], v[0]
            out = fused_decode.prefill(base16.hf, ["A", "A"], [prompts[0], prompts[1][C:]], [0, C], past)
            assert out is not None
            model16 = [
                base16.peft(input_ids=torch.tensor([p]), adapter_names=["A"]).logits[0, -1] for p in prompts
            ]
        with torch.no_grad():
            ref = [
                e32.bases["b"].peft(input_ids=torch.tensor([p]), adapter_names=["A"]).logits[0, -1]
                for p in prompts
            ]
        for i in range(2):
            want = ref[i].float().log_softmax(-1)
            fused = (out[0][i].float().log_softmax(-1) - want).abs()
            model = (model16[i].float().log_softmax(-1) - want).abs()
            assert fused.mean() < 0.02 and fused.max() < 0.2, (i, fused.mean(), fused.max())
            assert fused.mean() < model.mean() + 0.01, (i, fused.mean(), model.mean())
    finally:
        e16.close()
        e32.close()
