"""The panel kernel's products (precision.Panels) against the products before it, in one engine:
the two flip at every decode step of the same calls, so each pair of adjacent steps shares the
machine's state of the moment. Before: what `pack_weight` gives without panels, oneDNN's packed copy
of each fp32 weight of at least FP32_PACK_MIN_ELEMENTS and MKL's plain product for the rest and for
the LoRA stacks. fp32 only, on a CPU where the engine packs panels (AVX2 and FMA, no AVX512). Rows
over 4 LoRA adapters as a rollout decodes them, at each (batch, prompt length).

    .venv/bin/python bench/panels_ab.py [--reps 3] [--threads 2] [--shapes 8x1,20x8,32x1,20x18]
        [--tokens 64] [--source pkg:smollm2-135m-instruct] [--out F.json]

--shapes: batch x copies of a problem in each prompt (1: ~38 tokens, 18: ~350).
"""

from __future__ import annotations

import torch
from attention_ab import paired_steps, step_arguments
from marft_engine import fused_decode, precision
from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate
from probe import write_figures
from speed_bench import add_adapters


def panels_engine(source: str, script: str) -> tuple[Engine, list[str]]:
    """An fp32 engine on `source` with 4 LoRA adapters (their names), where the engine packs panels;
    else exits, saying so for `script`."""
    if not precision.panels_apply():
        raise SystemExit(
            f"{script}: the engine packs no panels here (needs AVX2 and FMA, no AVX512, a C++ compiler)"
        )
    eng = Engine(device="cpu", max_batch=64)
    eng.create_base(BaseCreate(name="s", source=source, dtype="float32"))
    return eng, add_adapters(eng, "s", "d", 4)


def main() -> None:
    args = step_arguments(__doc__ or "", "8x1,20x8,32x1,20x18")
    # Both sides through the model's forward: the fused decode layer takes panels only, so with it
    # on, the panel side would be fused and the other not, and the pairs would measure both changes.
    fused_decode.ENABLED = False
    eng, agents = panels_engine(args.source, "panels_ab")
    layers = [
        m
        for m in eng.bases["s"].hf.modules()
        if type(m) is torch.nn.Linear
        and isinstance(getattr(m, "_marft_packed", None), precision.Panels)
    ]
    panels = [m._marft_packed for m in layers]

    def packed_before() -> list[precision.Packed | None]:
        apply = precision.panels_apply
        precision.panels_apply = lambda: False  # type: ignore[method-assign]
        try:
            return [precision.pack_weight(m.weight) for m in layers]
        finally:
            precision.panels_apply = apply  # type: ignore[method-assign]

    # On the engine's compute thread, as the engine packs: oneDNN called first from another thread
    # slowed every later decode step of the engine, whichever product it ran.
    before = eng.compute.call(packed_before)
    most = precision.PANEL_MAX_ROWS

    def use_panels(on: bool) -> None:
        # off: no product takes panels (the LoRA stacks' products are plain)
        precision.PANEL_MAX_ROWS = most if on else 0
        for m, p, b in zip(layers, panels, before, strict=True):
            m._marft_packed = b if not on and b is not None else p

    res = paired_steps(eng, agents, use_panels, ("panels", "before"), "float32", args)
    eng.close()
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
