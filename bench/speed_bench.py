"""Engine speed against the hardware: the figures of issue 17, each a ratio measured in one run.

    .venv/bin/python bench/speed_bench.py [--quick] [--only=decode,train,prefix,short] [--source pkg:smollm2-135m-instruct] --out FILE.json

- matmul probe: the dense GEMM rate of this CPU (or GPU) in fp32 and bf16, n x n x n, on the engine's
  compute thread with its thread count. It is the compute limit the fractions below are taken against.
- decode_roofline_fraction: engine decode tokens/s at batch 32 (decode steps alone: a call's time
  less that of a call of one token, its prefill) over probe FLOP/s / FLOPs per token (2 x every
  linear weight incl. the LM head, plus attention over the context). Also in bf16.
  decode_bandwidth_fraction_*: the same rate over the memory limit, batch x read bandwidth (a probe:
  the sum of a 1 GiB tensor) / bytes a step reads (every weight, and each row's keys and values);
  decode_roofline_min_fraction_*: over the lower of the two limits, the roofline proper.
  decode_lora4_step_ms_*: a step with the rows spread over 4 LoRA adapters, as a rollout decodes.
  decode_sampling_flops_fraction_*: the same for the whole call, its prefill's FLOPs counted.
  decode_linears_ms_<kernel>_*: a step's weight products alone at batch 32, per probe kernel (the
  engine runs `panels` or, in its fused bf16 decode step, `panels_bf16` where it has them,
  precision.py).
- train_flops_fraction: model FLOP/s of forward_backward (PPO, LoRA r16 on every projection) on the
  demo's shapes (8 data of a 60-100 token prompt and a 12-20 token answer, weights on the answer) over
  the probe. Model FLOPs: 4 x linear weights x tokens (forward, and the backward's activation
  gradients; the frozen base has no weight gradients) + 4 x head weights x scored tokens (the head
  runs on the answer only) + 6 x LoRA weights x tokens + attention.
- mixed_adapter_train_speedup: 4 adapters' PPO updates (forward_backward + optim_step each), same
  data: 4 separate forward_backward calls against one forward_backward_batch.
- prefix_reuse_speedup: a 4-agent sequential rollout of 32 episodes whose prompts share a 300-token
  header of few-shot examples (16-token answers), with the prefix cache against without.
- engine_vs_generate_short: batch 64 of the demo's shape (a system prompt and a one-line problem;
  answers of 12-20 tokens, each row its own length): engine tokens/s (prefix cache on, and off) over
  plain `generate` on the same rows, which runs the batch to its longest answer (20); both count the
  12-20 wanted tokens of each row. In fp32 (the figures without a suffix) and in bf16 (`_bfloat16`:
  generate on a copy of the model wholly in bf16).

Every comparison alternates its sides `reps` times and takes each side's median: the machine is
shared, and alternating exposes both sides to the same load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from marft_engine.engine import Engine
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    ForwardBackwardBatch,
    ForwardBackwardRequest,
    LoraConfig,
    OptimStepRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)
from probe import (
    TARGETS,
    alternate,
    attention_flops,
    decode_step_bytes,
    demo_data,
    few_shot,
    linear_seconds,
    matmul_flops,
    problems,
    prompts_of,
    read_bandwidth,
    shape,
)
from short_answers import bench_short_answers

SMOL = "pkg:smollm2-135m-instruct"


# ----------------------------------------------------------------------------------------------------


def add_adapters(eng: Engine, base: str, prefix: str, n: int) -> list[str]:
    """n policies with LoRA r16 on every projection, as the demo's agents have: their names."""
    names = [f"{prefix}{k}" for k in range(n)]
    for k, name in enumerate(names):
        eng.create_adapter(
            AdapterCreate(
                name=name,
                base=base,
                lora=LoraConfig(r=16, alpha=32, target_modules=TARGETS),
                seed=k,
            )
        )
    return names


def bench_decode(
    eng: Engine, base: str, device: str, batch: int, new_tokens: int, reps: int
) -> dict[str, float]:
    """Decode alone: a call of new_tokens + 1 tokens less a call of 1 (the prefill and its token), so
    the prefill, which the per-token FLOPs below do not count, is not in the decode rate. The whole
    call's rate, its prefill's FLOPs counted, is `sampling_flops_fraction`. The same rows spread over
    4 LoRA adapters (r16 on every projection), as a 4-agent rollout decodes them, give `lora4_*`."""
    b = eng.bases[base]
    ps = prompts_of(b.tokenizer, "You are a helpful assistant.", problems(batch, 1))

    def call(n: int, adapters: list[str]) -> Callable[[], object]:
        sp = SamplingParams(temperature=1.0, max_new_tokens=n, ignore_eos=True)
        reqs = [
            SampleRequest(
                adapter=adapters[i % len(adapters)],
                base=base,
                prompt_ids=p,
                sampling=sp,
                seed=i,
            )
            for i, p in enumerate(ps)
        ]
        return lambda: eng.sample(SampleBatch(requests=reqs))

    call(2, ["__base__"])()  # warm-up
    dt = torch.float32 if b.dtype == torch.float32 else torch.bfloat16
    probe: list[float] = []
    bandwidth: list[float] = []

    def probes() -> None:
        probe.append(eng.compute.call(lambda: matmul_flops(dt, device)))
        bandwidth.append(eng.compute.call(lambda: read_bandwidth(device)))

    # the bare base first, before it has any adapter (as the figures before 2026-12-05 were taken)
    t = alternate(
        {
            "prefill": call(1, ["__base__"]),
            "decode": call(new_tokens + 1, ["__base__"]),
            "probe": probes,
        },
        reps,
        device,
    )
    agents = add_adapters(eng, base, "d", 4)
    call(2, agents)()  # warm-up
    t |= alternate(
        {
            "lora4_prefill": call(1, agents),
            "lora4_decode": call(new_tokens + 1, agents),
        },
        reps,
        device,
    )
    for name in agents:
        eng.delete_adapter(name)
    s = shape(b.hf)
    prompt = statistics.mean(len(p) for p in ps)
    ctx = prompt + new_tokens / 2
    per_token = 2 * (s["linear"] + s["head"]) + attention_flops(s, ctx)
    step = (t["decode"] - t["prefill"]) / new_tokens  # seconds per decode step
    lora4_step = (t["lora4_decode"] - t["lora4_prefill"]) / new_tokens
    tps = batch / step
    peak, bw = statistics.median(probe), statistics.median(bandwidth)
    width = 4 if dt == torch.float32 else 2
    step_bytes = decode_step_bytes(
        s, width, torch.finfo(b.cache_dtype or dt).bits // 8, batch, ctx
    )
    limit_compute, limit_bandwidth = peak / per_token, batch * bw / step_bytes
    kernels = eng.compute.call(lambda: linear_seconds(b.hf, batch))
    # the whole call: the prompts' tokens through the trunk (the head on the last one only), then
    # the decode steps
    prefill_flops = batch * (
        prompt * (2 * s["linear"] + attention_flops(s, prompt / 2)) + 2 * s["head"]
    )
    call_flops = prefill_flops + batch * new_tokens * per_token
    return {
        "tokens_per_s": tps,
        "step_ms": 1e3 * step,
        "prefill_s": t["prefill"],
        "lora4_step_ms": 1e3 * lora4_step,
        "lora4_tokens_per_s": batch / lora4_step,
        "probe_flops": peak,
        "flops_per_token": per_token,
        "limit_tokens_per_s": limit_compute,
        "roofline_fraction": tps / limit_compute,
        "sampling_flops_fraction": call_flops / t["decode"] / peak,
        # a step's weight products alone, per kernel
        **{f"linears_ms_{k}": 1e3 * v for k, v in kernels.items()},
        # the other limit: a step reads every weight and its rows' keys and values once
        "probe_bandwidth": bw,
        "step_bytes": step_bytes,
        "bandwidth_limit_tokens_per_s": limit_bandwidth,
        "bandwidth_fraction": tps / limit_bandwidth,
        "roofline_min_fraction": tps / min(limit_compute, limit_bandwidth),
    }


def ppo_updates(
    eng: Engine, names: list[str], n_data: int
) -> tuple[list[ForwardBackwardRequest], Callable[[], None], Callable[[], None]]:
    """These adapters' PPO calls on the demo's shapes (`demo_data`), and their updates two ways,
    optimizer steps included: the calls one by one, and one forward_backward_batch."""
    vocab = eng.adapters[names[0]].base.vocab_size
    calls = [
        ForwardBackwardRequest(
            adapter=n, loss="ppo", data=demo_data(vocab, n_data, 10 + k)
        )
        for k, n in enumerate(names)
    ]

    def steps() -> None:
        for n in names:
            eng.optim_step(OptimStepRequest(adapter=n))

    def separate() -> None:
        for c in calls:
            eng.forward_backward(c)
        steps()

    def shared() -> None:
        eng.forward_backward_batch(ForwardBackwardBatch(calls=calls))
        steps()

    return calls, separate, shared


def bench_train(
    eng: Engine, base: str, device: str, reps: int, n_data: int = 8
) -> dict[str, float]:
    names = add_adapters(eng, base, "t", 4)
    b = eng.bases[base]
    calls, separate, fused = ppo_updates(eng, names, n_data)

    def one() -> None:
        eng.forward_backward(calls[0])

    separate(), fused()  # warm-up
    dt = torch.float32 if b.dtype == torch.float32 else torch.bfloat16
    probe: list[float] = []
    t = alternate(
        {
            "separate": separate,
            "fused": fused,
            "one": one,
            "probe": lambda: probe.append(
                eng.compute.call(lambda: matmul_flops(dt, device))
            ),
        },
        reps,
        device,
    )
    s = shape(b.hf)
    s["lora"] = sum(p.numel() for p in eng.adapters["t0"].params)
    tokens = sum(len(d.tokens) for d in calls[0].data)
    scored = sum(sum(1 for w in d.weights or [] if w > 0) for d in calls[0].data)
    ctx = statistics.mean(len(d.tokens) for d in calls[0].data) / 2
    flops = 4 * s["linear"] * tokens + 4 * s["head"] * scored + 6 * s["lora"] * tokens
    flops += (
        3 * attention_flops(s, ctx) * tokens
    )  # forward, and the backward's two products
    peak = statistics.median(probe)
    for n in names:
        eng.delete_adapter(n)
    return {
        "mixed_adapter_train_speedup": t["separate"] / t["fused"],
        "separate_seconds": t["separate"],
        "fused_seconds": t["fused"],
        "forward_backward_seconds": t["one"],
        "model_flops_per_call": flops,
        "train_flops_fraction": flops / t["one"] / peak,
        "probe_flops": peak,
        "train_tokens_per_s": tokens / t["one"],
    }


def bench_prefix_reuse(
    eng: Engine,
    base: str,
    device: str,
    reps: int,
    episodes: int = 32,
    examples: int = 12,
) -> dict[str, float]:
    names = [f"agent{k}" for k in range(4)]
    for k, n in enumerate(names):
        if n not in eng.adapters:
            eng.create_adapter(AdapterCreate(name=n, base=base, seed=k))
    b = eng.bases[base]
    tok = b.tokenizer
    tasks = problems(episodes, 5)
    sp = SamplingParams(temperature=0.7, max_new_tokens=16, ignore_eos=True)
    header = few_shot(examples)
    header_tokens = len(tok(header, add_special_tokens=False)["input_ids"])

    def rollout() -> None:
        answers: list[list[str]] = [[] for _ in tasks]
        for k, n in enumerate(names):
            users = [
                f"{header}\n\nProblem: {t}"
                + "".join(f"\nagent{j}: {a}" for j, a in enumerate(answers[e]))
                for e, t in enumerate(tasks)
            ]
            ps = prompts_of(tok, f"You are agent {k} of a team. Be brief.", users)
            reqs = [
                SampleRequest(adapter=n, prompt_ids=p, sampling=sp, seed=100 * k + e)
                for e, p in enumerate(ps)
            ]
            out = eng.sample(SampleBatch(requests=reqs))
            for e, r in enumerate(out.results):
                answers[e].append(r.completions[0].text)

    budget = b.prefix_cache_bytes

    def with_reuse() -> None:
        b.prefix_cache_bytes = max(budget, 2**30)
        eng.sampler.prefix.pop(
            base, None
        )  # a cold cache: a rollout's first prompts miss
        rollout()

    def without() -> None:
        b.prefix_cache_bytes = 0
        rollout()

    eng.sample(
        SampleBatch(
            requests=[
                SampleRequest(adapter=names[0], prompt_ids=[1, 2, 3], sampling=sp)
            ]
        )
    )
    before = eng.stats({}).prefix_cache
    t = alternate({"off": without, "on": with_reuse}, reps, device)
    after = eng.stats({}).prefix_cache
    b.prefix_cache_bytes = budget
    return {
        "prefix_reuse_speedup": t["off"] / t["on"],
        "seconds_without": t["off"],
        "seconds_with": t["on"],
        "header_tokens": float(header_tokens),
        "reused_fraction": (after.hit_tokens - before.hit_tokens)
        / max(1, after.prompt_tokens - before.prompt_tokens),
    }


def report(part: dict[str, Any]) -> dict[str, Any]:
    """Print a section's figures as they come (a loaded machine makes the whole run long)."""
    for k, v in sorted(part.items()):
        print(
            f"  {k:46s} {v:.4g}" if isinstance(v, float) else f"  {k:46s} {v}",
            flush=True,
        )
    return part


PARTS = ("decode", "train", "prefix", "short")


def run_all(
    device: str,
    source: str,
    reps: int,
    quick: bool,
    dtypes: list[str],
    episodes: int,
    parts: tuple[str, ...] = PARTS,
) -> dict[str, Any]:
    res: dict[str, Any] = {
        "device": device,
        "source": source,
        "reps": reps,
        "torch_threads": torch.get_num_threads(),
    }
    for dtype in dtypes:
        eng = Engine(device=device, max_batch=64)
        try:
            eng.create_base(BaseCreate(name="s", source=source, dtype=dtype))  # type: ignore[arg-type]
            if "decode" in parts:
                d = bench_decode(eng, "s", device, 32, 16 if quick else 32, reps)
                res.update(report({f"decode_{k}_{dtype}": v for k, v in d.items()}))
            if "train" in parts:
                tr = bench_train(eng, "s", device, reps)
                res.update(report({f"{k}_{dtype}": v for k, v in tr.items()}))
            if dtype == "float32" and "prefix" in parts:
                # a byte-level tiny model (tests) takes 1024 tokens: a shorter header
                res.update(
                    report(
                        bench_prefix_reuse(
                            eng,
                            "s",
                            device,
                            reps,
                            examples=2 if source.startswith("tiny:") else 12,
                        )
                    )
                )
            if "short" in parts:
                short = bench_short_answers(eng, "s", device, reps)
                suffix = "" if dtype == "float32" else f"_{dtype}"
                res.update(report({f"{k}{suffix}": v for k, v in short.items()}))
        finally:
            eng.close()
    # headlines: fp32 (the engine's CPU default) against the fp32 probe
    for k in [
        "decode_roofline_fraction",
        "train_flops_fraction",
        "mixed_adapter_train_speedup",
    ]:
        src = (
            "decode_roofline_fraction_float32"
            if k.startswith("decode")
            else f"{k}_float32"
        )
        if src in res:
            res[k] = res[src]
    if "engine_vs_generate_short" in res:
        res["engine_vs_generate_ratio_short"] = res["engine_vs_generate_short"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--source", default=SMOL)
    ap.add_argument("--quick", action="store_true", help="3 alternations, 16 tokens")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (engine: 1)")
    ap.add_argument("--reps", type=int, default=None, help="alternations (5; quick 3)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--only", default=",".join(PARTS), help="parts (default: all)")
    ap.add_argument("--episodes", type=int, default=32, help="prefix-reuse episodes")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    unknown = set(args.only.split(",")) - set(PARTS)
    if unknown:
        ap.error(f"--only: {', '.join(sorted(unknown))} not one of {', '.join(PARTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    reps = args.reps or (3 if args.quick else 5)
    res = run_all(
        args.device,
        args.source,
        reps,
        args.quick,
        args.dtypes.split(","),
        args.episodes,
        tuple(args.only.split(",")),
    )
    res["seconds"] = time.time() - t0
    Path(args.out).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    for k, v in sorted(res.items()):
        print(f"{k:48s} {v:.4g}" if isinstance(v, float) else f"{k:48s} {v}")


if __name__ == "__main__":
    main()
