"""The engine on a GPU, prepared to run as is where a device is lent (it has never run on one yet).

    .venv/bin/python bench/gpu_bench.py --out /tmp/gpu_bench.json            # CUDA, ~0.5B model, bf16
    .venv/bin/python bench/gpu_bench.py --device cpu --source tiny:llama --quick --out F.json  # the CPU test

On a random-init model of Qwen2-0.5B's shape (`tiny:qwen2-0.5b`, no download) in bf16:
- probes: dense bf16 GEMM FLOP/s (8192^3 on a GPU) and memory bandwidth (a large device copy),
  measured in this run; --peak-tflops adds MFU against the datasheet peak too.
- sampling: engine tokens/s at batch 64 against plain `generate` on its own copy of the model, both
  forced to the same number of new tokens, alternated, medians.
- decode against the roofline: a decode step reads every weight once (and the KV cache); at batch B
  the bandwidth limit is B x bandwidth / bytes per step, the compute limit probe FLOP/s / FLOPs per
  token; the engine's decode rate against the lower of the two.
- training: forward_backward (PPO, LoRA r16 on every projection) + optim_step tokens/s, and model
  FLOP/s over the probe (MFU), as speed_bench.py counts them.
- mixed_adapter_train_speedup: 4 adapters' PPO updates on the demo's shapes (8 data each of a
  60-100 token prompt and a 12-20 token answer), 4 forward_backward calls against one
  forward_backward_batch, optimizer steps included, as speed_bench.py times it on a CPU. The shared
  pass takes its rows' LoRA terms stacked, as on a GPU by default (lora_batch.TRAIN_STACKED); `_runs`:
  by runs of one adapter's rows, as on a CPU.
Each figure is also printed; the JSON holds them all.
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
from marft_engine import lora_batch, precision
from marft_engine.engine import Engine
from marft_engine.models import load_source
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    Datum,
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
    left_padded,
    matmul_flops,
    shape,
    timed,
)
from speed_bench import add_adapters, ppo_updates


def bandwidth(device: str, elements: int) -> float:
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    x = torch.empty(elements, dtype=torch.bfloat16, device=device).fill_(1)
    y = torch.empty_like(x)
    y.copy_(x)
    t = statistics.median(timed(lambda: y.copy_(x), device) for _ in range(5))
    return 2 * x.numel() * x.element_size() / t


def bench_sampling(
    eng: Engine, base: str, device: str, batch: int, new: int, reps: int
) -> dict[str, float]:
    b = eng.bases[base]
    g = torch.Generator().manual_seed(0)
    vocab = min(b.vocab_size, len(b.tokenizer))
    prompts = [
        torch.randint(
            0, vocab - 8, (int(torch.randint(16, 64, (1,), generator=g)),), generator=g
        ).tolist()
        for _ in range(batch)
    ]
    sp = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True)
    reqs = [
        SampleRequest(adapter="__base__", base=base, prompt_ids=p, sampling=sp, seed=i)
        for i, p in enumerate(prompts)
    ]
    ids, mask = left_padded(prompts, b.pad_id, b.device)

    def load() -> torch.nn.Module:
        m = load_source(b.source, b.seed)[0]
        precision.store_parameters(m, b.device, b.dtype)  # as the engine stores it
        return m.eval()

    model = eng.compute.call(load)

    def generate() -> None:
        def run() -> None:
            with torch.no_grad(), b.autocast():
                model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=True,
                    top_k=0,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    pad_token_id=b.pad_id,
                )

        eng.compute.call(run)

    def engine() -> None:
        eng.sample(SampleBatch(requests=reqs))

    eng.sample(SampleBatch(requests=reqs[:4]))
    generate()
    t = alternate({"generate": generate, "engine": engine}, reps, device)
    return {
        "engine_tokens_per_s": batch * new / t["engine"],
        "generate_tokens_per_s": batch * new / t["generate"],
        "engine_vs_generate_ratio": t["generate"] / t["engine"],
        "mean_context": statistics.mean(len(p) for p in prompts) + new / 2,
    }


def bench_training(
    eng: Engine, base: str, device: str, rows: int, seq: int, reps: int
) -> dict[str, float]:
    eng.create_adapter(
        AdapterCreate(
            name="p", base=base, lora=LoraConfig(r=16, alpha=32, target_modules=TARGETS)
        )
    )
    b = eng.bases[base]
    g = torch.Generator().manual_seed(1)
    vocab = min(b.vocab_size, 32000)
    data = [
        Datum(
            tokens=torch.randint(0, vocab, (seq,), generator=g).tolist(),
            old_logprobs=[-5.0] * seq,
            advantages=torch.randn(seq, generator=g).tolist(),
        )
        for _ in range(rows)
    ]
    req = ForwardBackwardRequest(
        adapter="p", loss="ppo", data=data, micro_batch_tokens=rows * seq
    )

    def step() -> None:
        eng.forward_backward(req)
        eng.optim_step(OptimStepRequest(adapter="p"))

    step()
    t = statistics.median(timed(step, device) for _ in range(reps))
    s = shape(b.hf)
    s["lora"] = sum(p.numel() for p in eng.adapters["p"].params)
    tokens = rows * seq
    # every position is scored (weights default to all but token 0): the head runs on all of them
    flops = 4 * (s["linear"] + s["head"]) * tokens + 6 * s["lora"] * tokens
    flops += 3 * attention_flops(s, seq / 2) * tokens
    eng.delete_adapter("p")
    return {"train_tokens_per_s": tokens / t, "train_model_flops_per_s": flops / t}


def bench_mixed_training(
    eng: Engine, base: str, device: str, reps: int, rows: int
) -> dict[str, float]:
    names = add_adapters(eng, base, "m", 4)
    _, separate, shared_pass = ppo_updates(eng, names, rows)

    def shared(stacked: bool) -> Callable[[], None]:
        def run() -> None:
            lora_batch.TRAIN_STACKED = stacked
            shared_pass()

        return run

    try:
        for fn in (separate, shared(True), shared(False)):  # warm-up
            fn()
        t = alternate(
            {"separate": separate, "stacked": shared(True), "runs": shared(False)},
            reps,
            device,
        )
    finally:
        lora_batch.TRAIN_STACKED = None
        for n in names:
            eng.delete_adapter(n)
    return {
        "mixed_adapter_train_speedup": t["separate"] / t["stacked"],
        "mixed_adapter_train_speedup_runs": t["separate"] / t["runs"],
        "mixed_adapter_separate_seconds": t["separate"],
        "mixed_adapter_shared_seconds": t["stacked"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--source", default="tiny:qwen2-0.5b")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="datasheet dense bf16 peak, for MFU",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small shapes, 2 repetitions (the CPU test)",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    quick = args.quick
    batch, new, reps = (8, 8, 2) if quick else (64, 128, 5)
    rows, seq = (2, 32) if quick else (16, 512)
    t0 = time.time()
    res: dict[str, Any] = {
        "device": args.device,
        "source": args.source,
        "dtype": args.dtype,
    }
    if args.device == "cuda":
        res["gpu"] = torch.cuda.get_device_name()
    eng = Engine(device=args.device, max_batch=max(64, batch))
    try:
        eng.create_base(BaseCreate(name="m", source=args.source, dtype=args.dtype))
        b = eng.bases["m"]
        dt = b.dtype
        n = 1024 if quick else 8192
        res["probe_flops"] = eng.compute.call(
            lambda: matmul_flops(dt, args.device, n=n)
        )
        res["probe_bandwidth"] = eng.compute.call(
            lambda: bandwidth(args.device, 2**22 if quick else 2**29)
        )
        res.update(bench_sampling(eng, "m", args.device, batch, new, reps))
        s = shape(b.hf)
        width = torch.finfo(dt).bits // 8
        step_bytes = decode_step_bytes(
            s, width, 4 if b.cache_dtype else width, batch, res["mean_context"]
        )
        per_token = 2 * (s["linear"] + s["head"]) + attention_flops(
            s, res["mean_context"]
        )
        bw_limit = batch * res["probe_bandwidth"] / step_bytes
        flop_limit = res["probe_flops"] / per_token
        res["decode_bandwidth_limit_tokens_per_s"] = bw_limit
        res["decode_compute_limit_tokens_per_s"] = flop_limit
        res["decode_roofline_fraction"] = res["engine_tokens_per_s"] / min(
            bw_limit, flop_limit
        )
        res.update(bench_training(eng, "m", args.device, rows, seq, reps))
        res["train_mfu_vs_probe"] = res["train_model_flops_per_s"] / res["probe_flops"]
        res.update(bench_mixed_training(eng, "m", args.device, reps, 2 if quick else 8))
        if args.peak_tflops:
            res["train_mfu"] = res["train_model_flops_per_s"] / (
                args.peak_tflops * 1e12
            )
        res["num_parameters"] = float(sum(p.numel() for p in b.hf.parameters()))
    finally:
        eng.close()
    res["seconds"] = time.time() - t0
    Path(args.out).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    for k, v in sorted(res.items()):
        print(f"{k:40s} {v:.4g}" if isinstance(v, float) else f"{k:40s} {v}")


if __name__ == "__main__":
    main()
