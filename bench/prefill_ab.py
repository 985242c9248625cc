"""The fused prefill (fused_decode.prefill) against the padded pass through Hugging Face's forward, in
one engine: the two flip call by call (`fused_decode.PREFILL_ENABLED`), so each pair of adjacent calls
shares the machine's state of the moment. Each call samples one greedy token from each of its prompts
(one prefill pass), the prompts through 4 LoRA adapters in turn, as a rollout admits an agent's
prompts. fp32 where the engine packs panels (AVX2 and FMA, no AVX512), bf16 where it packs bf16
panels (AVX512_BF16, no AMX). Passes over more than `fused_decode.PREFILL_MAX_TOKENS` new tokens take
the padded pass on both sides, as they do in the sampler.

    .venv/bin/python bench/prefill_ab.py [--reps 7] [--threads 2] [--dtypes float32,bfloat16]
        [--shapes 1x8,1x18,4x18,10x18] [--source pkg:smollm2-135m-instruct] [--out F.json]

--shapes: prompts x copies of a problem in each prompt (1: ~38 tokens, 8: ~156, 18: ~326).
Figures per shape: each side's median call and their paired speedup; per dtype, the largest gap
between the two sides' first-token log-probs (bf16: the padded pass's products round to bf16).
"""

from __future__ import annotations

import time

import torch
from fused_ab import counting, fused_engines
from marft_engine import fused_decode
from marft_engine.schemas import SampleBatch, SampleRequest, SamplingParams
from probe import (
    ab_arguments,
    paired_figures,
    problems,
    prompts_of,
    write_figures,
)
from speed_bench import SMOL


def main() -> None:
    ap = ab_arguments(__doc__ or "", SMOL)
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads (a rollout's engine: all)"
    )
    ap.add_argument("--shapes", default="1x8,1x18,4x18,10x18")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fused = counting("prefill")
    res: dict[str, float] = {}
    for dtype, eng, agents in fused_engines(args, "prefill_ab"):
        fused[0] = 0
        gap = 0.0
        sp = SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)
        for shape in args.shapes.split(","):
            n, copies = (int(x) for x in shape.split("x"))
            users = [" ".join([p] * copies) for p in problems(n, 1)]
            ps = prompts_of(
                eng.bases["s"].tokenizer, "You are a helpful assistant.", users
            )
            reqs = [
                SampleRequest(
                    adapter=agents[i % 4], base="s", prompt_ids=p, sampling=sp
                )
                for i, p in enumerate(ps)
            ]
            seconds: dict[bool, list[float]] = {True: [], False: []}
            first: dict[bool, list[float]] = {}
            for k in range(2 * (args.reps + 1)):  # the first pair a warm-up
                on = k % 2 == 0
                fused_decode.PREFILL_ENABLED = on
                t = time.perf_counter()
                out = eng.sample(SampleBatch(requests=reqs))
                seconds[on].append(time.perf_counter() - t)
                first[on] = [r.completions[0].logprobs[0] for r in out.results]
            fused_decode.PREFILL_ENABLED = True
            gap = max(
                [gap]
                + [abs(a - b) for a, b in zip(first[True], first[False], strict=True)]
            )
            label = f"{dtype}_p{n}_tokens{sum(map(len, ps))}"
            res |= paired_figures(
                dtype, label, ("padded", "fused"), seconds[False], seconds[True]
            )
        if not fused[0]:
            raise SystemExit(
                f"prefill_ab: no {dtype} prefill of {args.source} was fused"
            )
        res[f"{dtype}_fused_prefills"] = fused[0]
        res[f"{dtype}_max_first_logprob_gap"] = gap
    if not res:
        raise SystemExit("prefill_ab: the fused prefill has no panels on this CPU")
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
