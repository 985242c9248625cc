"""Sampling (sampler.py) on the tiny model: parity with forward, the tempered policy, mixed-adapter
batches, stop / eos, adapters deleted mid-decode, several bases."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import PARITY_TOL, add_policy, perturb, seqs

from marft_engine.engine import Engine
from marft_engine.errors import EngineError
from marft_engine.schemas import (
    BaseCreate,
    ChatMessage,
    Datum,
    ForwardRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)


def test_sample_parity_with_forward_mixed_adapters_and_temperatures(engine: Engine) -> None:
    cases = [
        ("A", SamplingParams(temperature=1.0, max_new_tokens=12, n=2)),
        ("B", SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=9)),
        ("__base__", SamplingParams(temperature=1.3, top_k=20, max_new_tokens=7)),
        ("A", SamplingParams(temperature=0.0, max_new_tokens=10)),
    ]
    reqs = [
        SampleRequest(adapter=a, base="b", prompt_ids=s, sampling=sp)
        for (a, sp), s in zip(cases, seqs(len(cases), 11, 3, 15), strict=True)
    ]
    out = engine.sample(SampleBatch(requests=reqs, seed=3))
    for (a, sp), res in zip(cases, out.results, strict=True):
        assert res.adapter == a and res.adapter_version == (
            engine.adapters[a].version if a != "__base__" else 0
        )
        assert len(res.completions) == sp.n
        for c in res.completions:
            assert len(c.response_ids) == len(c.logprobs) == len(c.sampler_logprobs) == sp.max_new_tokens
            toks = res.prompt_ids + c.response_ids
            t = sp.temperature if sp.temperature > 0 else 1.0
            f = engine.forward(ForwardRequest(adapter=a, base="b", data=[Datum(tokens=toks)], temperature=t))
            got = torch.tensor(f.results[0].logprobs[len(res.prompt_ids) :])
            assert torch.allclose(got, torch.tensor(c.logprobs), atol=PARITY_TOL), (a, sp)
            if sp.temperature == 0:
                assert c.sampler_logprobs == [0.0] * len(c.response_ids)
            elif sp.top_k == 0 and sp.top_p == 1:
                assert c.sampler_logprobs == c.logprobs
            else:  # truncation renormalises: the sampled token is at least as likely under the sampler
                assert all(s >= p - 1e-6 for s, p in zip(c.sampler_logprobs, c.logprobs, strict=True))


def test_sampled_tokens_follow_the_tempered_policy(engine: Engine) -> None:
    """Full-vocabulary sampling draws tokens with the policy's probabilities: 4000 one-token samples
    against the policy's probabilities from forward passes, every token of probability > 1% within 4.5
    standard errors (an off-by-one in the inverse CDF or a biased draw moves whole classes)."""
    prompt = [7, 100, 42, 9]
    T, n = 0.1, 4000  # the tiny model is near-uniform: a low temperature gives it likely tokens
    sp = SamplingParams(temperature=T, max_new_tokens=1, n=n // 16)
    req = SampleRequest(adapter="__base__", base="b", prompt_ids=prompt, sampling=sp)
    res = engine.sample(SampleBatch(requests=[req] * 16, seed=5)).results
    completions = [c for r in res for c in r.completions]
    vocab = engine.bases["b"].vocab_size
    got = torch.bincount(torch.tensor([c.response_ids[0] for c in completions]), minlength=vocab)
    every = [Datum(tokens=[*prompt, t]) for t in range(vocab)]
    f = engine.forward(ForwardRequest(adapter="__base__", base="b", data=every, temperature=T))
    p = torch.tensor([r.logprobs[-1] for r in f.results]).exp()  # [V] the tempered policy
    assert abs(float(p.sum()) - 1) < 1e-4
    assert int((p > 0.01).sum()) >= 3  # several likely tokens, so the test means something
    for t in torch.nonzero(p > 0.01)[:, 0].tolist():
        se = float((p[t] * (1 - p[t]) / n).sqrt())
        assert abs(float(got[t]) / n - float(p[t])) < 4.5 * se, (t, float(got[t]) / n, float(p[t]))
    for c in completions:  # the sampler is the policy itself here
        assert c.sampler_logprobs == c.logprobs


def test_mixed_adapter_batch_equals_separate_calls(engine: Engine) -> None:
    prompts = seqs(4, 21, 3, 12)
    adapters = ["A", "B", "__base__", "B"]
    for temperature in (0.0, 0.9):
        reqs = [
            SampleRequest(
                adapter=a,
                base="b",
                prompt_ids=p,
                seed=100 + i,
                sampling=SamplingParams(temperature=temperature, max_new_tokens=10, n=2),
            )
            for i, (a, p) in enumerate(zip(adapters, prompts, strict=True))
        ]
        mixed = engine.sample(SampleBatch(requests=reqs)).results
        for r, m in zip(reqs, mixed, strict=True):
            alone = engine.sample(SampleBatch(requests=[r])).results[0]
            assert [c.response_ids for c in alone.completions] == [c.response_ids for c in m.completions]
            for c1, c2 in zip(alone.completions, m.completions, strict=True):
                assert torch.allclose(torch.tensor(c1.logprobs), torch.tensor(c2.logprobs), atol=PARITY_TOL)
        if temperature > 0:  # different seeds do give different samples
            assert mixed[1].completions[0].response_ids != mixed[1].completions[1].response_ids


def test_decode_steps_that_reuse_each_layers_plan_follow_rows_and_weights(engine: Engine) -> None:
    """A LoRA layer settles its path once for a run of passes over the same rows and weights
    (lora_batch._Plan). Rows leaving mid-call, a second call over the same rows, and new weights
    for one adapter between two calls whose rows are the same throughout must all give forward's
    log-probs, and the new weights new ones."""
    # prompts of one length: their prefill runs over the padded layout, as the decode steps do, so
    # a call's first pass may take over the plans of the previous call's last
    prompts = [p[:5] for p in seqs(4, 31, 6, 12)]
    adapters = ["A", "B", "__base__", "A"]

    def run(lengths: list[int]) -> list[tuple[list[int], list[float]]]:
        reqs = [
            SampleRequest(
                adapter=a,
                base="b",
                prompt_ids=p,
                seed=i,
                sampling=SamplingParams(temperature=0.8, max_new_tokens=n),
            )
            for i, (a, p, n) in enumerate(zip(adapters, prompts, lengths, strict=True))
        ]
        out = []
        for a, res in zip(adapters, engine.sample(SampleBatch(requests=reqs)).results, strict=True):
            c = res.completions[0]
            f = engine.forward(
                ForwardRequest(
                    adapter=a, base="b", data=[Datum(tokens=res.prompt_ids + c.response_ids)], temperature=0.8
                )
            )
            want = torch.tensor(f.results[0].logprobs[len(res.prompt_ids) :])
            assert torch.allclose(want, torch.tensor(c.logprobs), atol=PARITY_TOL), a
            out.append((c.response_ids, c.logprobs))
        return out

    first = run([3, 10, 6, 10])  # rows leave after 3 and 6 steps
    assert run([3, 10, 6, 10]) == first  # the same seeds, rows and weights: the same tokens and log-probs
    before = run([6] * 4)
    perturb(engine, "A", seed=77)
    after = run([6] * 4)  # forward's log-probs under A's new weights (checked in run)
    assert after[0][1] != before[0][1] and after[1] == before[1]  # A's rows changed, B's did not


def test_sample_chat_stop_eos_and_n(engine: Engine) -> None:
    msgs = [ChatMessage(role="user", content="hello")]
    res = engine.sample(
        SampleBatch(
            requests=[SampleRequest(adapter="A", messages=msgs, sampling=SamplingParams(max_new_tokens=5))],
            seed=0,
        )
    ).results[0]
    tok = engine.bases["b"].tokenizer
    assert tok.decode(res.prompt_ids) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    # a stop string made of the byte the greedy row produces third: the ids end at that token
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    g = engine.sample(
        SampleBatch(requests=[SampleRequest(adapter="B", prompt_ids=[65, 66], sampling=greedy)])
    )
    ids = g.results[0].completions[0].response_ids
    stop_text = tok.decode(ids[2:3])
    first = tok.decode(ids).find(stop_text)
    sp = greedy.model_copy(update={"stop": [stop_text]})
    s = engine.sample(SampleBatch(requests=[SampleRequest(adapter="B", prompt_ids=[65, 66], sampling=sp)]))
    c = s.results[0].completions[0]
    assert c.finish_reason == "stop"
    assert c.text == tok.decode(ids)[:first]
    assert tok.decode(c.response_ids).endswith(stop_text)
    # eos: make eos the greedy choice by training-free means: ask the base for a row ending in eos
    eos = engine.bases["b"].eos_ids[0]
    f = engine.forward(ForwardRequest(adapter="B", data=[Datum(tokens=[65, 66, eos])]))
    assert f.results[0].logprobs[2] < 0  # defined for eos as any token


def test_deleting_an_adapter_mid_decode_fails_its_call(engine: Engine) -> None:
    add_policy(engine, "doomed", seed=12)
    long = SamplingParams(max_new_tokens=600, ignore_eos=True)
    fut = engine.submit_sample(
        SampleBatch(requests=[SampleRequest(adapter="doomed", prompt_ids=[1], sampling=long)])
    )
    while "b" not in engine.sampler.running and not fut.done():
        time.sleep(0.001)
    engine.delete_adapter("doomed")
    with pytest.raises(EngineError) as err:
        fut.result(timeout=60)
    assert err.value.status == 409 and "deleted" in err.value.message


def test_two_bases_in_one_call(engine: Engine) -> None:
    engine.create_base(BaseCreate(name="q", source="tiny:qwen2", seed=5, dtype="float32"))
    try:
        add_policy(engine, "qa", base="q", seed=6)
        sp = SamplingParams(temperature=0, max_new_tokens=6)
        reqs = [
            SampleRequest(adapter="A", prompt_ids=[5, 6, 7], sampling=sp),
            SampleRequest(adapter="qa", prompt_ids=[5, 6, 7], sampling=sp),
        ]
        both = engine.sample(SampleBatch(requests=reqs)).results
        for r, res in zip(reqs, both, strict=True):
            assert res.completions == engine.sample(SampleBatch(requests=[r])).results[0].completions
        assert both[0].completions[0].response_ids != both[1].completions[0].response_ids
    finally:
        engine.delete_adapter("qa")
        del engine.bases["q"]
