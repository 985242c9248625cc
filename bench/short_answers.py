"""The short-answer comparison of `speed_bench.py` (engine_vs_generate_short): batch 64 of the demo's
shape (a system prompt and a one-line problem; answers of 12-20 tokens, each row its own length),
the engine (prefix cache on, and off) against plain `generate` on its own copy of the model, which
runs the batch to its longest answer; and the FLOPs bound of that shape."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from marft_engine.engine import Engine
from marft_engine.models import load_source
from marft_engine.schemas import SampleBatch, SampleRequest, SamplingParams
from probe import alternate, left_padded, problems, prompts_of, sampling_flops, shape


def bench_short_answers(
    eng: Engine, base: str, device: str, reps: int, batch: int = 64
) -> dict[str, float]:
    b = eng.bases[base]
    tok = b.tokenizer
    ps = prompts_of(tok, "Answer with only the final number.", problems(batch, 3))
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(12, 21, (batch,), generator=g).tolist()
    reqs = [
        SampleRequest(
            adapter="__base__",
            base=base,
            prompt_ids=p,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=n, ignore_eos=True),
            seed=i,
        )
        for i, (p, n) in enumerate(zip(ps, lengths, strict=True))
    ]
    ids, mask = left_padded(ps, b.pad_id, b.device)
    L = ids.shape[1]
    # plain transformers on its own copy of the model (no LoRA layers injected), on the compute
    # thread; for a bf16 base the whole copy in bf16, generate's fastest setting (bf16 cache and
    # attention too, where the engine keeps them fp32 on a CPU)
    model = eng.compute.call(
        lambda: load_source(b.source, b.seed)[0].to(b.device, b.dtype).eval()
    )

    def generate() -> None:
        def run() -> None:
            with torch.no_grad():
                model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=True,
                    top_k=0,
                    max_new_tokens=max(lengths),
                    min_new_tokens=max(lengths),
                    pad_token_id=b.pad_id,
                )

        eng.compute.call(run)

    budget = b.prefix_cache_bytes

    def engine(on: bool) -> Callable[[], None]:
        def go() -> None:
            b.prefix_cache_bytes = 2**30 if on else 0
            eng.sampler.prefix.pop(base, None)  # cold: only sharing within the batch
            eng.sample(SampleBatch(requests=reqs))

        return go

    before = eng.stats({}).prefix_cache
    engine(True)()  # also the warm-up
    # the tokens the engine prefilled: the prompts after their cached prefixes, and the prefixes
    # they share, prefilled once before them
    prefilled = eng.stats({}).prefix_cache.prefill_tokens - before.prefill_tokens
    generate()
    t = alternate(
        {
            "generate": generate,
            "engine": engine(True),
            "engine_no_reuse": engine(False),
        },
        reps,
        device,
    )
    b.prefix_cache_bytes = budget
    wanted = sum(lengths)
    s, prompt = shape(b.hf), statistics.mean(len(p) for p in ps)
    # the first token of each row comes from the prefill; generate runs every row to the longest
    gen = sampling_flops(
        s, batch * L, L, batch, batch * (max(lengths) - 1), L + max(lengths) / 2
    )
    mine = sampling_flops(
        s,
        prefilled,
        prompt,
        batch,
        wanted - batch,
        prompt + statistics.mean(lengths) / 2,
    )
    return {
        # the speedup a compute-bound machine allows: generate's model FLOPs over the engine's
        "engine_vs_generate_short_flops_bound": gen / mine,
        "engine_vs_generate_short": t["generate"] / t["engine"],
        "engine_vs_generate_short_no_reuse": t["generate"] / t["engine_no_reuse"],
        "engine_short_tokens_per_s": wanted / t["engine"],
        "generate_short_tokens_per_s": wanted / t["generate"],
    }
