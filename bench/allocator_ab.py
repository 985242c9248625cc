"""The engine's CPU passes on tcmalloc against glibc's malloc: processes alternated, one allocator
each, so each pair shares the machine's state of the moment (an allocator is chosen when a process
starts: LD_PRELOAD, as the launcher does, src/client/launcher.ts: engineAllocatorEnv).

Each process times, after a warm-up, the median of 3 of: 4 adapters' PPO updates as 4
`forward_backward` calls (8 rows of the demo's shapes each) and as one `forward_backward_batch`,
optimizer steps included; a `sample` call of 16 prompts of 60-200 tokens over the 4 adapters, 24 new
tokens each; a `forward` (log-probs) of 32 rows of 70-120 tokens; and its minor page faults. Needs
the library `make setup` unpacks (.cache/tcmalloc/libtcmalloc_minimal.so.4).

    .venv/bin/python bench/allocator_ab.py [--pairs 3] [--dtype bfloat16] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

LIB = Path(__file__).resolve().parents[1] / ".cache/tcmalloc/libtcmalloc_minimal.so.4"


def child(dtype: str) -> dict[str, float]:
    from marft_engine.engine import Engine
    from marft_engine.schemas import (
        BaseCreate,
        Datum,
        ForwardRequest,
        SampleBatch,
        SampleRequest,
        SamplingParams,
    )
    from speed_bench import SMOL, add_adapters, ppo_updates

    eng = Engine(device="cpu", max_batch=64)
    eng.create_base(BaseCreate(name="s", source=SMOL, dtype=dtype))  # type: ignore[arg-type]
    names = add_adapters(eng, "s", "t", 4)
    _, separate, shared = ppo_updates(eng, names, 8)
    g = torch.Generator().manual_seed(0)

    def ids(lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi, (1,), generator=g))
        return torch.randint(0, 30000, (n,), generator=g).tolist()

    sp = SamplingParams(temperature=1.0, max_new_tokens=24, ignore_eos=True)
    reqs = [
        SampleRequest(
            adapter=names[i % 4], base="s", prompt_ids=ids(60, 200), sampling=sp, seed=i
        )
        for i in range(16)
    ]
    rows = [Datum(tokens=ids(70, 120)) for _ in range(32)]

    parts = {
        "ppo_4_calls": separate,
        "ppo_shared_pass": shared,
        "sample_16x24": lambda: eng.sample(SampleBatch(requests=reqs)),
        "forward_32": lambda: eng.forward(ForwardRequest(adapter=names[0], data=rows)),
    }
    for f in parts.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in parts}
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        for k, f in parts.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["minor_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    eng.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.dtype)), flush=True)
        return
    if not LIB.exists():
        sys.exit(f"{LIB}: missing (make setup unpacks it)")
    runs: dict[str, list[dict[str, float]]] = {"glibc": [], "tcmalloc": []}
    for p in range(args.pairs):
        for side, got in runs.items():
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            if side == "tcmalloc":
                env["LD_PRELOAD"] = str(LIB)
            cmd = [sys.executable, __file__, "--child", "--dtype", args.dtype]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(f"pair {p + 1} {side:8s} {got[-1]}", flush=True)
    res: dict[str, float] = {}
    for k in runs["glibc"][0]:
        if k != "minor_faults":
            ratios = [a[k] / b[k] for a, b in zip(runs["glibc"], runs["tcmalloc"])]
            res[f"{k}_speedup"] = statistics.median(ratios)
        for side, rs in runs.items():
            res[f"{k}_{side}"] = statistics.median(r[k] for r in rs)
    for k, v in sorted(res.items()):
        print(f"{k:36s} {v:.4g}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
