"""Prepacked weights against plain ones, in one process: per dtype, two engines on the same base, one
as shipped and one that packs nothing (`precision.pack_weight` returning None, as the test does),
their decode steps alternated (a call of 17 tokens less a call of 1), bare base and rows over 4
adapters, at each batch size. Alternating within one process keeps both sides under the same load:
on a shared machine the speed drifts more between processes than the effect. bf16 only where the
CPU has native bf16; there the two sides must sample the same tokens (the packed product is the
plain one's kernel). In fp32 the packed product is oneDNN's and the plain one MKL's, so a rare token
may differ by rounding: `tokens_same` is the share of sampled tokens that agree. Both sides decode
through the model's forward (the fused decode step off): in bf16 the fused step multiplies on its own
bf16 panels on both sides, and the pairs would compare nothing. Each call starts from an empty prefix
cache, so both prefill their prompts whole.

    .venv/bin/python bench/packing_ab.py [--reps 7] [--dtypes float32,bfloat16] [--batches 32,8]
        [--source pkg:smollm2-135m-instruct] [--out F.json]
"""

from __future__ import annotations

import statistics
import time

import torch
from marft_engine import fused_decode, precision
from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate, SampleBatch, SampleRequest, SamplingParams
from probe import ab_arguments, paired_speedup, problems, prompts_of, write_figures
from speed_bench import SMOL, add_adapters


def engine(packing: bool, source: str, dtype: str) -> Engine:
    pack = precision.pack_weight
    if not packing:
        precision.pack_weight = lambda w, bias=None: None  # type: ignore[assignment]
    try:
        eng = Engine(device="cpu", max_batch=64)
        eng.create_base(BaseCreate(name="s", source=source, dtype=dtype))
        add_adapters(eng, "s", "d", 4)
        eng.sample(
            SampleBatch(
                requests=[SampleRequest(adapter="d0", base="s", prompt_ids=[1, 2, 3])]
            )
        )
    finally:  # stacks are packed lazily: the warm-up above built them while packing was off
        precision.pack_weight = pack
    return eng


def step_ms(
    eng: Engine, agents: list[str], ps: list[list[int]]
) -> tuple[float, list[list[int]]]:
    def call(n: int) -> SampleBatch:
        sp = SamplingParams(temperature=1.0, max_new_tokens=n, ignore_eos=True)
        return SampleBatch(
            requests=[
                SampleRequest(
                    adapter=agents[i % len(agents)],
                    base="s",
                    prompt_ids=p,
                    sampling=sp,
                    seed=i,
                )
                for i, p in enumerate(ps)
            ]
        )

    eng.sampler.prefix.clear()
    t = time.perf_counter()
    eng.sample(call(1))
    t1 = time.perf_counter() - t
    eng.sampler.prefix.clear()
    t = time.perf_counter()
    out = eng.sample(call(17))
    t17 = time.perf_counter() - t
    return (t17 - t1) / 16 * 1e3, [
        c.response_ids for r in out.results for c in r.completions
    ]


def same_share(a: list[list[int]], b: list[list[int]]) -> float:
    """The share of positions whose sampled tokens agree (rows of equal lengths: ignore_eos)."""
    pairs = [
        (x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)
    ]
    return sum(x == y for x, y in pairs) / len(pairs)


def compare(dtype: str, batch: int, source: str, reps: int) -> dict[str, float]:
    """The figures of one dtype at one batch size, keys `{base,lora4}_{figure}`."""
    packed, plain = engine(True, source, dtype), engine(False, source, dtype)
    ps = prompts_of(
        packed.bases["s"].tokenizer, "You are a helpful assistant.", problems(batch, 1)
    )
    res: dict[str, float] = {}
    for label, agents in [
        ("base", ["__base__"]),
        ("lora4", [f"d{k}" for k in range(4)]),
    ]:
        on: list[float] = []
        off: list[float] = []
        same: list[float] = []
        for _ in range(reps + 1):  # the first round warms up
            a, tokens_a = step_ms(packed, agents, ps)
            b, tokens_b = step_ms(plain, agents, ps)
            if dtype == "bfloat16":
                assert tokens_a == tokens_b, (
                    "packed and plain bf16 products sampled different tokens"
                )
            on.append(a)
            off.append(b)
            same.append(same_share(tokens_a, tokens_b))
        on, off = on[1:], off[1:]
        res[f"{label}_packed_step_ms"] = statistics.median(on)
        res[f"{label}_plain_step_ms"] = statistics.median(off)
        res[f"{label}_packing_speedup"] = paired_speedup(off, on)
        res[f"{label}_tokens_same"] = min(same)
        print(
            f"{dtype} batch {batch} {label}: packed {[round(x, 1) for x in on]} "
            f"plain {[round(x, 1) for x in off]}",
            flush=True,
        )
    packed.close()
    plain.close()
    return res


def main() -> None:
    ap = ab_arguments(__doc__ or "", SMOL)
    ap.add_argument("--batches", default="32,8")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    if "bfloat16" in dtypes and not precision.native_bf16():
        print(
            "packing_ab: this CPU has no native bf16, so bf16 weights are not packed; fp32 only"
        )
        dtypes.remove("bfloat16")
    torch.set_num_threads(1)
    fused_decode.ENABLED = False  # the module docstring says why
    res: dict[str, float] = {}
    for dtype in dtypes:
        for batch in (int(b) for b in args.batches.split(",")):
            part = compare(dtype, batch, args.source, args.reps)
            res |= {f"{dtype}_b{batch}_{k}": v for k, v in part.items()}
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
