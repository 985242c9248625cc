"""The fused decode step (fused_decode.py) against the same step through Hugging Face's forward, in
one engine: the two flip at every decode step of the same calls, so each pair of adjacent steps shares
the machine's state of the moment. Both sides attend with the same kernel. In fp32 both multiply on
the same panels (precision.Panels), so what differs is everything around the products; in bf16 the
fused side multiplies on the kernel's bf16 panels and the model's on oneDNN's packed weights. fp32
where the engine packs panels (AVX2 and FMA, no AVX512), bf16 where it packs bf16 panels
(AVX512_BF16, no AMX). Rows over 4 LoRA adapters as a rollout decodes them, at each (batch, prompt
length).

    .venv/bin/python bench/fused_ab.py [--reps 3] [--threads 2] [--dtypes float32,bfloat16]
        [--shapes 8x1,20x8,32x1,20x18] [--tokens 64] [--source pkg:smollm2-135m-instruct] [--out F.json]

--shapes: batch x copies of a problem in each prompt (1: ~38 tokens, 18: ~350).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from attention_ab import paired_steps, step_arguments
from marft_engine import fused_decode, precision
from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate
from probe import ab_dtypes, write_figures
from speed_bench import add_adapters


def fused_engine(source: str, dtype: str) -> tuple[Engine, list[str]] | None:
    """An engine on `source` in `dtype` with 4 LoRA adapters (their names), where the fused step
    has its panels here; else None."""
    if not (
        precision.panels_apply()
        if dtype == "float32"
        else precision.bf16_panels_apply()
    ):
        return None
    eng = Engine(device="cpu", max_batch=64)
    eng.create_base(BaseCreate(name="s", source=source, dtype=dtype))
    return eng, add_adapters(eng, "s", "d", 4)


def counting(name: str) -> list[int]:
    """fused_decode.<name> (`logits` or `prefill`) wrapped so that the list's one number counts the
    calls it applied to: a pair's fused side must have been fused, or the pairs compare nothing."""
    took = [0]
    fn = getattr(fused_decode, name)

    def counted(*a: object, **k: object) -> object:
        out = fn(*a, **k)
        took[0] += out is not None
        return out

    setattr(fused_decode, name, counted)
    return took


def fused_engines(
    args: argparse.Namespace, script: str
) -> Iterator[tuple[str, Engine, list[str]]]:
    """For each of args.dtypes this CPU has panels for: the dtype, an engine on args.source (closed
    after) and its 4 adapters; the others skipped, said so."""
    for dtype in ab_dtypes(args.dtypes, script):
        made = fused_engine(args.source, dtype)
        if made is None:
            print(f"{script}: no {dtype} panels on this CPU; {dtype} skipped")
            continue
        eng, agents = made
        try:
            yield dtype, eng, agents
        finally:
            eng.close()


def main() -> None:
    args = step_arguments(__doc__ or "", "8x1,20x8,32x1,20x18")

    def use_fused(on: bool) -> None:
        fused_decode.ENABLED = on

    took = counting("logits")
    res: dict[str, float] = {}
    for dtype, eng, agents in fused_engines(args, "fused_ab"):
        took[0] = 0
        res |= paired_steps(eng, agents, use_fused, ("fused", "model"), dtype, args)
        if not took[0]:
            raise SystemExit(
                f"fused_ab: no {dtype} decode step of {args.source} took the fused layer"
            )
        res[f"{dtype}_fused_steps"] = took[0]
    if not res:
        raise SystemExit("fused_ab: the fused step has no panels on this CPU")
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
