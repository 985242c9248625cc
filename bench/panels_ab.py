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

import statistics
import time

import torch
from attention_ab import call
from marft_engine import precision
from marft_engine.engine import Engine
from marft_engine.sampler import Sampler
from marft_engine.schemas import BaseCreate
from probe import ab_arguments, problems, prompts_of, write_figures
from speed_bench import SMOL, add_adapters


def main() -> None:
    ap = ab_arguments(__doc__ or "", SMOL)
    ap.set_defaults(reps=3)
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads (a rollout's engine: all)"
    )
    ap.add_argument("--shapes", default="8x1,20x8,32x1,20x18")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not precision.panels_apply():
        raise SystemExit(
            "panels_ab: the engine packs no panels here (needs AVX2 and FMA, no AVX512, a C++ compiler)"
        )
    eng = Engine(device="cpu", max_batch=64)
    eng.create_base(BaseCreate(name="s", source=args.source, dtype="float32"))
    agents = add_adapters(eng, "s", "d", 4)
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
        precision.PANEL_MAX_ROWS = (
            most if on else 0
        )  # off: no product takes panels (LoRA stacks plain)
        for m, p, b in zip(layers, panels, before, strict=True):
            m._marft_packed = b if not on and b is not None else p

    # every decode step of the sampler, timed, with the panels on at odd steps
    steps: dict[bool, list[float]] = {False: [], True: []}
    original = Sampler._step

    def step(self: Sampler, base: object) -> None:
        on = len(steps[False]) > len(steps[True])
        use_panels(on)
        t = time.perf_counter()
        original(self, base)  # type: ignore[arg-type]
        steps[on].append(time.perf_counter() - t)

    Sampler._step = step  # type: ignore[method-assign]
    res: dict[str, float] = {}
    for shape in args.shapes.split(","):
        batch, copies = (int(x) for x in shape.split("x"))
        users = [" ".join([p] * copies) for p in problems(batch, 1)]
        ps = prompts_of(eng.bases["s"].tokenizer, "You are a helpful assistant.", users)
        call(eng, agents, ps, 5)  # warm-up
        ratios, on_ms, off_ms = [], [], []
        for _ in range(args.reps):
            steps[False].clear()
            steps[True].clear()
            call(eng, agents, ps, args.tokens + 1)
            off, on = (
                steps[False][1:],
                steps[True][1:],
            )  # the first pair after the prefill dropped
            ratios += [a / b for a, b in zip(off, on, strict=False)]
            on_ms.append(1e3 * statistics.median(on))
            off_ms.append(1e3 * statistics.median(off))
        key = f"float32_b{batch}_ctx{round(statistics.mean(map(len, ps)))}"
        res[f"{key}_panels_step_ms"] = statistics.median(on_ms)
        res[f"{key}_before_step_ms"] = statistics.median(off_ms)
        res[f"{key}_speedup"] = statistics.median(ratios)
        print(f"{key}: panels {on_ms} ms, before {off_ms} ms a step", flush=True)
    Sampler._step = original  # type: ignore[method-assign]
    use_panels(True)
    eng.close()
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
