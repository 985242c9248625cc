"""The decode-attention kernel against SDPA, in one engine: `decode_attention.ENABLED` flips at every
decode step of the same calls, so each pair of adjacent steps (one each way) shares the machine's state
of the moment and nearly the same context (one column apart). On a shared machine, alternating whole
calls or processes drifts more than the effect. Per dtype, rows over 4 LoRA adapters as a rollout
decodes them, at each (batch, prompt length): the bench's short prompts (the speed bench's decode
shape) and prompts of about 350 tokens (a 4-agent rollout's mean context). A bf16 base's cache is
bf16 (the kernel's, precision.place): SDPA's side reads it in fp32, as it would an fp32 cache, after
converting it on every step, which the kernel does not need.

    .venv/bin/python bench/attention_ab.py [--reps 3] [--dtypes float32,bfloat16] [--threads 2]
        [--shapes 32x1,20x18] [--tokens 64] [--source pkg:smollm2-135m-instruct] [--out F.json]

--shapes: batch x copies of a problem in each prompt (1: ~38 tokens, 18: ~350).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from marft_engine import decode_attention, fused_decode, kernels
from marft_engine.engine import Engine
from marft_engine.sampler import Sampler
from marft_engine.schemas import BaseCreate, SampleBatch, SampleRequest, SamplingParams
from probe import ab_arguments, ab_dtypes, problems, prompts_of, write_figures
from speed_bench import SMOL, add_adapters


def call(eng: Engine, agents: list[str], ps: list[list[int]], n: int) -> None:
    """One sample call: prompt i through adapter i mod 4, n tokens each."""
    sp = SamplingParams(temperature=1.0, max_new_tokens=n, ignore_eos=True)
    reqs = [
        SampleRequest(
            adapter=agents[i % 4], base="s", prompt_ids=p, sampling=sp, seed=i
        )
        for i, p in enumerate(ps)
    ]
    eng.sample(SampleBatch(requests=reqs))


def paired_steps(
    eng: Engine,
    agents: list[str],
    switch: Callable[[bool], None],
    sides: tuple[str, str],
    key: str,
    args: argparse.Namespace,
) -> dict[str, float]:
    """Every decode step of the sampler timed, `switch(True)` before odd steps and `switch(False)`
    before even ones, over args.reps calls of args.tokens tokens at each of args.shapes (batch x
    copies of a problem in a prompt): per shape, the median step of each side (sides: the names of on
    and off) and the median of the paired ratios off / on."""
    steps: dict[bool, list[float]] = {False: [], True: []}
    original = Sampler._step

    def step(self: Sampler, base: object) -> None:
        on = len(steps[False]) > len(steps[True])
        switch(on)
        t = time.perf_counter()
        original(self, base)  # type: ignore[arg-type]
        steps[on].append(time.perf_counter() - t)

    Sampler._step = step  # type: ignore[method-assign]
    res: dict[str, float] = {}
    try:
        for shape in args.shapes.split(","):
            batch, copies = (int(x) for x in shape.split("x"))
            users = [" ".join([p] * copies) for p in problems(batch, 1)]
            ps = prompts_of(
                eng.bases["s"].tokenizer, "You are a helpful assistant.", users
            )
            call(eng, agents, ps, 5)  # warm-up
            ratios, on_ms, off_ms = [], [], []
            for _ in range(args.reps):
                steps[False].clear()
                steps[True].clear()
                call(eng, agents, ps, args.tokens + 1)
                # the first pair after the prefill dropped
                off, on = steps[False][1:], steps[True][1:]
                ratios += [a / b for a, b in zip(off, on, strict=False)]
                on_ms.append(1e3 * statistics.median(on))
                off_ms.append(1e3 * statistics.median(off))
            name = f"{key}_b{batch}_ctx{round(statistics.mean(map(len, ps)))}"
            res[f"{name}_{sides[0]}_step_ms"] = statistics.median(on_ms)
            res[f"{name}_{sides[1]}_step_ms"] = statistics.median(off_ms)
            res[f"{name}_speedup"] = statistics.median(ratios)
            print(
                f"{name}: {sides[0]} {on_ms} ms, {sides[1]} {off_ms} ms a step",
                flush=True,
            )
    finally:
        Sampler._step = original  # type: ignore[method-assign]
        switch(True)
    return res


def step_arguments(doc: str, shapes: str) -> argparse.Namespace:
    """The options of a paired decode-step A/B (this script, panels_ab.py), parsed; torch's threads
    set."""
    ap = ab_arguments(doc, SMOL)
    ap.set_defaults(reps=3)
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads (a rollout's engine: all)"
    )
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def main() -> None:
    args = step_arguments(__doc__ or "", "32x1,20x18")
    if kernels.load() is None:
        raise SystemExit(
            "attention_ab: the kernel could not be built here (see the warning above)"
        )
    # Both sides through the model's forward: the fused decode layer calls the kernel itself, whatever
    # decode_attention.ENABLED says, so with it on this would pair the fused layer with itself.
    fused_decode.ENABLED = False
    res: dict[str, float] = {}
    for dtype in ab_dtypes(args.dtypes, "attention_ab"):
        eng = Engine(device="cpu", max_batch=64)
        eng.create_base(BaseCreate(name="s", source=args.source, dtype=dtype))  # type: ignore[arg-type]
        agents = add_adapters(eng, "s", "d", 4)

        def switch(on: bool) -> None:
            decode_attention.ENABLED = on

        res |= paired_steps(eng, agents, switch, ("kernel", "sdpa"), dtype, args)
        eng.close()
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
