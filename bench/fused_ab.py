"""The fused decode step (fused_decode.py) against the same step through Hugging Face's forward, in
one engine: the two flip at every decode step of the same calls, so each pair of adjacent steps shares
the machine's state of the moment. Both sides multiply on the same panels (precision.Panels) and
attend with the same kernel; what differs is everything around them. fp32 only, on a CPU where the
engine packs panels (AVX2 and FMA, no AVX512). Rows over 4 LoRA adapters as a rollout decodes them, at
each (batch, prompt length).

    .venv/bin/python bench/fused_ab.py [--reps 3] [--threads 2] [--shapes 8x1,20x8,32x1,20x18]
        [--tokens 64] [--source pkg:smollm2-135m-instruct] [--out F.json]

--shapes: batch x copies of a problem in each prompt (1: ~38 tokens, 18: ~350).
"""

from __future__ import annotations

from attention_ab import paired_steps, step_arguments
from marft_engine import fused_decode
from panels_ab import panels_engine
from probe import write_figures


def main() -> None:
    args = step_arguments(__doc__ or "", "8x1,20x8,32x1,20x18")
    eng, agents = panels_engine(args.source, "fused_ab")

    def use_fused(on: bool) -> None:
        fused_decode.ENABLED = on

    # fused steps: the fused side must have been fused, or the pairs compare nothing
    took = [0]
    logits = fused_decode.logits

    def counted(*a: object, **k: object) -> object:
        out = logits(*a, **k)  # type: ignore[arg-type]
        took[0] += out is not None
        return out

    fused_decode.logits = counted  # type: ignore[assignment]
    res = paired_steps(eng, agents, use_fused, ("fused", "model"), "float32", args)
    eng.close()
    if not took[0]:
        raise SystemExit(
            f"fused_ab: no decode step of {args.source} took the fused layer"
        )
    res["fused_steps"] = took[0]
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
