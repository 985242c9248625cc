"""Training and forward passes over real tokens only (unpad.py) against padded ones, in one process:
one engine, `unpad.ENABLED` switched in turn around each call, so each pair of calls shares the
machine's state of the moment. Calls: PPO `forward_backward` on 8 rows of the demo's shapes (60-100
prompt tokens, 12-20 answer tokens: 16% of a padded micro-batch is padding), `forward` over the same
rows, a critic's `forward` (values) over 32 such rows, and a prefill: 16 prompts of 100-500 tokens
over 4 adapters, as a rollout's later agents read the earlier answers (one greedy token). Asserts that the two sides agree within
fp32 rounding (the loss, every gradient, every log-prob and value; the prefill's token log-probs).

    .venv/bin/python bench/unpad_ab.py [--reps 7] [--dtypes float32,bfloat16]
        [--source pkg:smollm2-135m-instruct] [--out F.json]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from marft_engine import unpad
from marft_engine.engine import Engine
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    ForwardRequest,
    LoraConfig,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)
from probe import (
    ab_arguments,
    ab_dtypes,
    demo_data,
    logprob_results,
    paired_figures,
    ppo_results,
    write_figures,
)
from speed_bench import SMOL, TARGETS, add_adapters


def compare(dtype: str, source: str, reps: int) -> dict[str, float]:
    eng = Engine(device="cpu", max_batch=64)
    eng.create_base(BaseCreate(name="s", source=source, dtype=dtype))
    (name,) = add_adapters(eng, "s", "t", 1)
    eng.create_adapter(
        AdapterCreate(
            name="critic",
            base="s",
            kind="critic",
            lora=LoraConfig(r=16, alpha=32, target_modules=TARGETS),
        )
    )
    data = demo_data(eng.bases["s"].vocab_size, 8, 10)
    many = demo_data(eng.bases["s"].vocab_size, 32, 11)

    def fb() -> list[torch.Tensor]:
        return ppo_results(eng, name, data)

    def logprobs() -> list[torch.Tensor]:
        return logprob_results(eng, name, data)

    g = torch.Generator().manual_seed(12)
    vocab = min(32000, eng.bases["s"].vocab_size)
    prompts = []
    for _ in range(16):
        n = int(torch.randint(100, 501, (1,), generator=g))
        prompts.append(torch.randint(0, vocab, (n,), generator=g).tolist())
    agents = [*add_adapters(eng, "s", "p", 4)]

    def prefill() -> list[torch.Tensor]:
        sp = SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)
        reqs = [
            SampleRequest(adapter=agents[i % 4], base="s", prompt_ids=p, sampling=sp)
            for i, p in enumerate(prompts)
        ]
        res = eng.sample(SampleBatch(requests=reqs)).results
        return [torch.tensor(r.completions[0].logprobs) for r in res]

    def values() -> list[torch.Tensor]:
        return [
            torch.tensor(r.values or [])
            for r in eng.forward(ForwardRequest(adapter="critic", data=many)).results
        ]

    tol = 1e-5 if dtype == "float32" else 2e-2
    res: dict[str, float] = {}
    calls: dict[str, Callable[[], list[torch.Tensor]]] = {
        "forward_backward": fb,
        "forward": logprobs,
        "critic_forward": values,
        "prefill": prefill,
    }
    for label, run in calls.items():
        padded: list[float] = []
        real: list[float] = []
        for _ in range(reps + 1):  # the first round warms up
            sides = []
            for flag, times in ((False, padded), (True, real)):
                unpad.ENABLED = flag
                t = time.perf_counter()
                sides.append(run())
                times.append(time.perf_counter() - t)
            unpad.ENABLED = True
            for a, b in zip(*sides, strict=True):
                assert float((a - b).norm()) <= tol * float(b.norm()) + 1e-9, (
                    f"{dtype} {label}: the sides differ"
                )
        res |= paired_figures(dtype, label, ("padded", "unpadded"), padded, real)
    eng.close()
    return res


def main() -> None:
    args = ab_arguments(__doc__ or "", SMOL).parse_args()
    torch.set_num_threads(1)
    res: dict[str, float] = {}
    for dtype in ab_dtypes(args.dtypes, "unpad_ab"):
        res |= {
            f"{dtype}_{k}": v for k, v in compare(dtype, args.source, args.reps).items()
        }
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
