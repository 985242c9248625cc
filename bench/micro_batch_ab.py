"""A CPU training pass's allocations kept small against large, in one process: one engine, switched
in turn around each call, so each pair of calls shares the machine's state of the moment.

- small (the engine's default on a CPU): the LM head over HEAD_ROWS scored positions at a time, and
  a training call's micro-batches capped so tokens x the widest layer x 4 bytes stay within
  CPU_ACTIVATION_BYTES (training.token_budget: 2730 tokens for SmolLM2);
- large (the engine before): the head over all scored positions at once, micro-batches of the
  call's own budget (8192 tokens by default).

glibc maps allocations over 32 MB fresh from the kernel when its heap has no room for them, so large
passes can fault in new pages on every call; the script reports each side's page faults per call
(the process's minor faults). Calls: PPO `forward_backward` on 32 rows of the demo's shapes (60-100
prompt tokens, 12-20 answer tokens: one micro-batch of about 3,000 tokens when large, two when
small), and `forward` (log-probs; the head alone differs) on 64 such rows. Asserts that the two
sides agree within fp32 rounding (the loss, every gradient, every log-prob). Runs on torch's
threads (all cores), as the engine does.

    .venv/bin/python bench/micro_batch_ab.py [--reps 3] [--dtypes float32,bfloat16]
        [--source pkg:smollm2-135m-instruct] [--out F.json]
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable

import torch
from marft_engine import training
from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate
from probe import (
    ab_arguments,
    ab_dtypes,
    demo_data,
    logprob_results,
    paired_figures,
    ppo_results,
    write_figures,
)
from speed_bench import SMOL, add_adapters

SMALL = (training.HEAD_ROWS, training.CPU_ACTIVATION_BYTES)
LARGE = (2**30, 2**40)


def switch(side: tuple[int, int]) -> None:
    training.HEAD_ROWS, training.CPU_ACTIVATION_BYTES = side


def compare(dtype: str, source: str, reps: int) -> dict[str, float]:
    eng = Engine(device="cpu", max_batch=64)
    eng.create_base(BaseCreate(name="s", source=source, dtype=dtype))
    (name,) = add_adapters(eng, "s", "t", 1)
    data = demo_data(eng.bases["s"].vocab_size, 32, 10)
    many = demo_data(eng.bases["s"].vocab_size, 64, 11)

    def fb() -> list[torch.Tensor]:
        return ppo_results(eng, name, data)

    def logprobs() -> list[torch.Tensor]:
        return logprob_results(eng, name, many)

    tol = 1e-5 if dtype == "float32" else 2e-2
    res: dict[str, float] = {}
    calls: dict[str, Callable[[], list[torch.Tensor]]] = {
        "forward_backward": fb,
        "forward": logprobs,
    }
    for label, run in calls.items():
        seconds: dict[str, list[float]] = {"large": [], "small": []}
        faults: dict[str, list[int]] = {"large": [], "small": []}
        for _ in range(reps + 1):  # the first round warms up
            sides = []
            for side, setting in (("large", LARGE), ("small", SMALL)):
                switch(setting)
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t = time.perf_counter()
                sides.append(run())
                seconds[side].append(time.perf_counter() - t)
                f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                faults[side].append(f1 - f0)
            switch(SMALL)
            for a, b in zip(*sides, strict=True):
                assert float((a - b).norm()) <= tol * float(b.norm()) + 1e-9, (
                    f"{dtype} {label}: the sides differ"
                )
        res |= paired_figures(
            dtype, label, ("large", "small"), seconds["large"], seconds["small"]
        )
        for side in ("large", "small"):
            print(f"{dtype} {label}: {side} page faults {faults[side][1:]}")
            res[f"{label}_{side}_page_faults"] = statistics.median(faults[side][1:])
    eng.close()
    return res


def main() -> None:
    ap = ab_arguments(__doc__ or "", SMOL)
    ap.set_defaults(reps=3)
    args = ap.parse_args()
    res: dict[str, float] = {}
    for dtype in ab_dtypes(args.dtypes, "micro_batch_ab"):
        res |= {
            f"{dtype}_{k}": v for k, v in compare(dtype, args.source, args.reps).items()
        }
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
