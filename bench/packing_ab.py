"""Prepacked bf16 weights against plain ones, in one process: two engines on the same bf16 base, one
as shipped and one that packs nothing (`precision.pack_weight` returning None, as the test does),
their decode steps alternated (a call of 17 tokens less a call of 1), bare base and rows over 4
adapters. Alternating within one process keeps both sides under the same load: on a shared machine
the speed drifts more between processes than the effect. Only where the CPU has native bf16.

    .venv/bin/python bench/packing_ab.py [--reps 7] [--source pkg:smollm2-135m-instruct] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from marft_engine import precision
from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate, SampleBatch, SampleRequest, SamplingParams
from probe import problems, prompts_of
from speed_bench import SMOL, add_adapters


def engine(packing: bool, source: str) -> Engine:
    pack = precision.pack_weight
    if not packing:
        precision.pack_weight = lambda w, bias=None: None  # type: ignore[assignment]
    try:
        eng = Engine(device="cpu", max_batch=64)
        eng.create_base(BaseCreate(name="s", source=source, dtype="bfloat16"))
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

    t = time.perf_counter()
    eng.sample(call(1))
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    out = eng.sample(call(17))
    t17 = time.perf_counter() - t
    return (t17 - t1) / 16 * 1e3, [
        c.response_ids for r in out.results for c in r.completions
    ]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--source", default=SMOL)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not precision.native_bf16():
        raise SystemExit(
            "packing_ab: this CPU has no native bf16, so nothing is packed"
        )
    torch.set_num_threads(1)
    packed, plain = engine(True, args.source), engine(False, args.source)
    ps = prompts_of(
        packed.bases["s"].tokenizer, "You are a helpful assistant.", problems(32, 1)
    )
    res: dict[str, object] = {}
    for label, agents in [
        ("base", ["__base__"]),
        ("lora4", [f"d{k}" for k in range(4)]),
    ]:
        on: list[float] = []
        off: list[float] = []
        for _ in range(args.reps + 1):  # the first round warms up
            a, tokens_a = step_ms(packed, agents, ps)
            b, tokens_b = step_ms(plain, agents, ps)
            assert tokens_a == tokens_b, (
                "packed and plain products sampled different tokens"
            )
            on.append(a)
            off.append(b)
        on, off = on[1:], off[1:]
        res[f"{label}_packed_step_ms"] = statistics.median(on)
        res[f"{label}_plain_step_ms"] = statistics.median(off)
        res[f"{label}_packing_speedup"] = statistics.median(
            b / a for a, b in zip(on, off, strict=True)
        )
        print(
            label,
            f"packed {[round(x, 1) for x in on]} plain {[round(x, 1) for x in off]}",
            flush=True,
        )
    packed.close()
    plain.close()
    for k, v in sorted(res.items()):
        print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
