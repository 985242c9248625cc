"""A call cut into shards for data-parallel replicas (shards.py), without Ray: the shards' gradients,
loss and stats, each computed with the whole call's totals, add up to the whole call's."""

from __future__ import annotations

import pytest
import torch
from helpers import add_policy, ppo_data

from marft_engine import shards
from marft_engine.engine import Engine
from marft_engine.schemas import (
    Completion,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    PPOConfig,
    SampleBatch,
    SampleRequest,
    SampleResponse,
    SampleResult,
    SamplingParams,
)
from marft_engine.training import LOSSES

# fp32 sums in another order (and micro-batches padded to other lengths): relative to the scale
TOL = 1e-5


def test_split_keeps_order_balances_tokens_and_leaves_no_run_empty() -> None:
    def runs(sizes: list[int], parts: int) -> list[tuple[int, int]]:
        return [(r.start, r.stop) for r in shards.split([Datum(tokens=[1] * n) for n in sizes], parts)]

    assert runs([5, 5, 5, 5], 2) == [(0, 2), (2, 4)]
    assert runs([20, 2, 2, 2], 2) == [(0, 1), (1, 4)]
    assert runs([2, 2, 2, 20], 2) == [(0, 3), (3, 4)]
    assert runs([3], 4) == [(0, 1)]  # fewer data than parts: one run per datum
    assert runs([2, 2, 2], 3) == [(0, 1), (1, 2), (2, 3)]
    assert runs([30, 2, 2, 2, 2], 3) == [(0, 1), (1, 2), (2, 5)]


def sample_call(rows: list[int], seeded: bool = True) -> SampleBatch:
    return SampleBatch(
        requests=[
            SampleRequest(
                adapter="a", prompt_ids=[1, 2], seed=i if seeded else None, sampling=SamplingParams(n=n)
            )
            for i, n in enumerate(rows)
        ],
        seed=7,
    )


def test_a_sample_call_is_cut_by_rows_only_where_every_request_has_its_seed() -> None:
    def runs(body: SampleBatch, parts: int) -> list[tuple[int, int]]:
        return [(r.start, r.stop) for r in shards.split_sample(body, parts)]

    assert runs(sample_call([1, 1, 1, 1]), 2) == [(0, 2), (2, 4)]
    assert runs(sample_call([4, 1, 1, 1, 1]), 2) == [(0, 1), (1, 5)]
    assert runs(sample_call([1, 1, 1]), 4) == [(0, 1), (1, 2), (2, 3)]
    assert runs(sample_call([1]), 2) == [(0, 1)]
    assert runs(sample_call([1, 1, 1, 1]), 1) == [(0, 4)]
    # a request seeded from the call's seed and its index in the call: the call goes whole
    body = sample_call([1, 1, 1, 1])
    body.requests[2] = body.requests[2].model_copy(update={"seed": None})
    assert runs(body, 2) == [(0, 4)]
    assert runs(sample_call([1, 1], seeded=False), 2) == [(0, 2)]
    part = shards.sample_part(sample_call([1, 1, 1, 1]), range(2, 4))
    assert [r.seed for r in part.requests] == [2, 3] and part.seed == 7


def test_a_sample_calls_parts_answer_in_request_order() -> None:
    def answer(ids: list[int], seconds: float) -> SampleResponse:
        results = [
            SampleResult(
                completions=[
                    Completion(
                        response_ids=[i],
                        logprobs=[0.0],
                        sampler_logprobs=[0.0],
                        text="x",
                        finish_reason="length",
                    )
                ],
                prompt_ids=[1, 2],
                adapter="a",
                adapter_version=0,
            )
            for i in ids
        ]
        return SampleResponse(results=results, tokens_sampled=len(ids), seconds=seconds)

    merged = shards.merge_sample([answer([0, 1], 2.0), answer([2], 3.0)])
    assert [r.completions[0].response_ids[0] for r in merged.results] == [0, 1, 2]
    assert merged.tokens_sampled == 3 and merged.seconds == 3.0


def test_refusal_messages_name_the_whole_calls_index() -> None:
    msg = "data[2].tokens[5]: token id 999 is outside the vocabulary [0, 256)"
    assert shards.whole_call_message(msg, 4).startswith("data[6].tokens[5]:")
    msg = "requests[1].prompt_ids[0]: token id 999 is outside the vocabulary [0, 256)"
    assert shards.whole_call_message(msg, 3).startswith("requests[4].prompt_ids[0]:")
    assert shards.whole_call_message("adapter: unknown adapter 'x'", 4) == "adapter: unknown adapter 'x'"


def test_the_summaries_are_the_loss_tables() -> None:
    for name, loss in LOSSES.items():
        assert loss.summary is shards.SUMMARIES.get(name), name


def _grads(engine: Engine, name: str) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in engine.adapters[name].params]
    engine.adapters[name].optimizer.zero_grad(set_to_none=True)
    return out


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


@pytest.mark.parametrize("ppo", [PPOConfig(), PPOConfig(aggregation="token-sum", entropy_coef=0.01)])
def test_shards_of_a_policy_call_add_up_to_the_call(engine: Engine, ppo: PPOConfig) -> None:
    add_policy(engine, "sh", seed=11)
    try:
        data = ppo_data(engine, "sh", 41, n=7)
        body = ForwardBackwardRequest(adapter="sh", loss="ppo", data=data, ppo=ppo)
        whole = engine.forward_backward(body)
        g_whole = _grads(engine, "sh")
        totals = shards.call_totals(data)
        parts = [
            engine.forward_backward(shards.shard_request(body, r), totals) for r in shards.split(data, 3)
        ]
        g_parts = _grads(engine, "sh")  # the shards' gradients accumulated, as the all-reduce sums them
        merged = shards.merge_forward_backward("ppo", parts)
        for a, b in zip(g_whole, g_parts, strict=True):
            assert float((a - b).abs().max()) <= TOL * float(a.abs().max())
        assert _close(merged.loss, whole.loss)
        assert merged.stats.keys() == whole.stats.keys()
        for k, v in whole.stats.items():
            if k != "micro_batches":  # the shards' count: each shard has its own
                assert _close(merged.stats[k], v), (k, merged.stats[k], v)
        assert merged.stats["micro_batches"] == 3
        assert (merged.num_data, merged.num_tokens) == (whole.num_data, whole.num_tokens)
    finally:
        engine.delete_adapter("sh")


def test_shards_of_a_value_call_add_up_to_the_call(engine: Engine) -> None:
    data = [
        Datum(tokens=d.tokens, returns=d.advantages, old_values=[0.1] * len(d.tokens))
        for d in ppo_data(engine, "A", 43, n=6)
    ]
    body = ForwardBackwardRequest(adapter="C", loss="value", data=data)
    whole = engine.forward_backward(body)
    g_whole = _grads(engine, "C")
    totals = shards.call_totals(data)
    parts = [engine.forward_backward(shards.shard_request(body, r), totals) for r in shards.split(data, 2)]
    g_parts = _grads(engine, "C")
    merged = shards.merge_forward_backward("value", parts)
    for a, b in zip(g_whole, g_parts, strict=True):
        assert float((a - b).abs().max()) <= TOL * float(a.abs().max())
    assert "explained_variance" in whole.stats and "return_sq" not in merged.stats
    for k, v in whole.stats.items():
        if k != "micro_batches":
            assert _close(merged.stats[k], v), (k, merged.stats[k], v)


def test_shards_of_a_forward_are_the_forward(engine: Engine) -> None:
    data = [Datum(tokens=d.tokens) for d in ppo_data(engine, "A", 45, n=5)]
    whole = engine.forward(ForwardRequest(adapter="A", data=data))
    parts = [
        engine.forward(ForwardRequest(adapter="A", data=data[r.start : r.stop]))
        for r in shards.split(data, 2)
    ]
    merged = shards.merge_forward(parts)
    for a, b in zip(whole.results, merged.results, strict=True):
        assert a.logprobs is not None and b.logprobs is not None
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
