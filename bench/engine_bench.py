"""Engine benchmark: sampling vs plain `generate`, mixed-adapter batching, memory layout, training speed.

    .venv/bin/python bench/engine_bench.py [--device cpu|cuda] [--quick] --out FILE.json

Figures (all measured in this run, in this process unless noted):
- engine_vs_generate_ratio: engine `sample` tokens/s over transformers `generate` tokens/s, same model
  (SmolLM2-135M), same prompts, batch, new-token count (both forced to the full length: ignore_eos
  on the engine, min_new_tokens on generate), plain sampling at temperature 1.
- mixed_adapter_speedup: one sample call with 4 adapters x rows vs 4 calls of one adapter each.
- memory_ratio_N_agents: peak RSS of our layout (one base + N policy adapters + 1 critic) over the
  reference layout (N + 1 full model copies, each with its LoRA), each measured in a fresh subprocess.
- train_tokens_per_s: forward_backward (ppo) + optim_step, tokens per second; on CPU also with bf16
  autocast (train_bf16_tokens_per_s, train_bf16_vs_fp32).
- on CUDA also train_mfu: tiny:qwen2-0.5b in bf16, model FLOPs = 4 x params x tokens (forward 2N and
  the backward's activation gradients 2N; the frozen base has no weight gradients) over the GPU's
  dense bf16 peak (--peak-tflops, default 989 for an H100/H200 SXM).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from marft_engine.engine import Engine
from marft_engine.models import load_smollm2
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    LoraConfig,
    OptimStepRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)

SMOL = "pkg:smollm2-135m-instruct"
QUESTIONS = [
    "What is the capital of France?",
    "Name a prime number larger than ten.",
    "Why is the sky blue?",
    "Give me a word that rhymes with cat.",
    "What is two plus two?",
    "Write a haiku about rain.",
    "Who wrote Hamlet?",
    "What colour is grass?",
]


T = TypeVar("T")


def prompts(tokenizer: object, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        ids = tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=False
        )  # type: ignore[attr-defined]
        out.append(
            [int(t) for t in (ids["input_ids"] if isinstance(ids, dict) else ids)]
        )
    return out


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_engine(
    eng: Engine, reqs: list[SampleRequest], device: str, reps: int
) -> tuple[float, int]:
    best, tokens = float("inf"), 0
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        out = eng.sample(SampleBatch(requests=reqs, seed=0))
        sync(device)
        best = min(best, time.perf_counter() - t0)
        tokens = out.tokens_sampled
    return best, tokens


def bench_sampling(
    device: str, batch: int, new_tokens: int, reps: int
) -> dict[str, float]:
    eng = Engine(device=device, max_batch=max(64, batch))
    res: dict[str, float] = {}
    try:
        eng.create_base(BaseCreate(name="plain", source=SMOL))
        base = eng.bases["plain"]
        ps = prompts(base.tokenizer, batch)
        sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)

        # plain transformers generate on its own copy of the model (no LoRA layers injected). It runs
        # on the engine's compute thread too (`on_thread`): on a CPU a second thread doing torch work
        # gets a second OpenMP pool, and two pools on these cores slow each other down.
        def on_thread(fn: Callable[[], T]) -> T:
            return eng.compute.call(fn)

        def load() -> tuple[torch.nn.Module, Any]:
            m, t = load_smollm2()
            return m.to(device=base.device, dtype=base.dtype).eval(), t

        model, tok = on_thread(load)
        tok.padding_side = "left"
        L = max(len(p) for p in ps)
        ids = torch.full((batch, L), base.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, L), dtype=torch.long)
        for i, p in enumerate(ps):
            ids[i, L - len(p) :] = torch.tensor(p)
            mask[i, L - len(p) :] = 1
        ids, mask = ids.to(base.device), mask.to(base.device)
        kw = {
            "do_sample": True,
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 1.0,
            "max_new_tokens": new_tokens,
            "min_new_tokens": new_tokens,
            "pad_token_id": base.pad_id,
        }
        reqs = [
            SampleRequest(adapter="__base__", base="plain", prompt_ids=p, sampling=sp)
            for p in ps
        ]
        warm = [
            r.model_copy(
                update={"sampling": sp.model_copy(update={"max_new_tokens": 4})}
            )
            for r in reqs
        ]

        def generate(**over: int) -> torch.Tensor:
            with torch.no_grad(), base.autocast():
                return model.generate(
                    input_ids=ids, attention_mask=mask, **{**kw, **over}
                )

        time_engine(eng, warm, device, 1)
        on_thread(lambda: generate(max_new_tokens=4, min_new_tokens=4))
        # Interleaved repetitions, best of each: the machine's load drifts, and this keeps both sides
        # measured under the same conditions.
        t_gen, t_eng, n_eng = float("inf"), float("inf"), 0
        for _ in range(max(2, reps)):
            sync(device)
            t0 = time.perf_counter()
            out = on_thread(generate)
            sync(device)
            t_gen = min(t_gen, time.perf_counter() - t0)
            t, n_eng = time_engine(eng, reqs, device, 1)
            t_eng = min(t_eng, t)
        gen_tokens = (out.shape[1] - L) * batch
        res["generate_tokens_per_s"] = gen_tokens / t_gen
        res["engine_tokens_per_s"] = n_eng / t_eng
        res["engine_vs_generate_ratio"] = (
            res["engine_tokens_per_s"] / res["generate_tokens_per_s"]
        )

        # the same batch through a LoRA adapter (PEFT layers in the path)
        eng.create_adapter(AdapterCreate(name="a0", base="plain"))
        for k in range(1, 4):
            eng.create_adapter(AdapterCreate(name=f"a{k}", base="plain", seed=k))
        lreqs = [r.model_copy(update={"adapter": "a0", "base": None}) for r in reqs]
        t, n = time_engine(eng, lreqs, device, reps)
        res["engine_lora_tokens_per_s"] = n / t
        res["engine_lora_vs_generate_ratio"] = (
            res["engine_lora_tokens_per_s"] / res["generate_tokens_per_s"]
        )

        # mixed: 4 adapters in one call vs one call per adapter
        mixed = [
            r.model_copy(update={"adapter": f"a{i % 4}", "base": None})
            for i, r in enumerate(reqs)
        ]
        t_mixed, _ = time_engine(eng, mixed, device, reps)
        t_sep = 0.0
        for k in range(4):
            t, _ = time_engine(
                eng, [r for r in mixed if r.adapter == f"a{k}"], device, reps
            )
            t_sep += t
        res["mixed_adapter_seconds"] = t_mixed
        res["separate_adapter_seconds"] = t_sep
        res["mixed_adapter_speedup"] = t_sep / t_mixed
    finally:
        eng.close()
    return res


def bench_training(
    device: str, source: str, batch: int, seq: int, steps: int, dtype: str
) -> dict[str, float]:
    eng = Engine(device=device)
    try:
        info = eng.create_base(BaseCreate(name="t", source=source, dtype=dtype))  # type: ignore[arg-type]
        targets = [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
        eng.create_adapter(
            AdapterCreate(
                name="p",
                base="t",
                lora=LoraConfig(r=16, alpha=32, target_modules=targets),
            )
        )
        g = torch.Generator().manual_seed(0)
        vocab = min(info.vocab_size, 32000)
        data = [
            Datum(
                tokens=torch.randint(0, vocab, (seq,), generator=g).tolist(),
                old_logprobs=[-5.0] * seq,
                advantages=torch.randn(seq, generator=g).tolist(),
            )
            for _ in range(batch)
        ]
        req = ForwardBackwardRequest(
            adapter="p", loss="ppo", data=data, micro_batch_tokens=batch * seq
        )
        eng.forward_backward(req)
        eng.optim_step(OptimStepRequest(adapter="p"))
        sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.forward_backward(req)
            eng.optim_step(OptimStepRequest(adapter="p"))
        sync(device)
        dt = time.perf_counter() - t0
        tokens = batch * seq * steps
        return {
            "train_tokens_per_s": tokens / dt,
            "num_parameters": float(info.num_parameters),
        }
    finally:
        eng.close()


# ----------------------------------------------------------------------------------------------------
# memory: each layout in a fresh process


def _materialize(model: torch.nn.Module) -> None:
    """Weights loaded from safetensors stay file-backed (mmap) and could be shared by the copies; the
    reference's per-agent models are separate copies (on GPU, separate allocations), so give each its
    own memory."""
    for p in model.parameters():
        p.data = p.data.clone()


def memory_child(layout: str, agents: int) -> None:
    torch.set_num_threads(1)
    probe = [Datum(tokens=list(range(100, 164)))]
    if layout == "ours":
        eng = Engine(device="cpu")
        # The engine's frozen base stays as loaded (file-backed safetensors pages); the forward passes
        # below touch every weight, so all of it is resident and counted.
        eng.create_base(
            BaseCreate(name="b", source=SMOL, dtype="float32")
        )  # like the fp32 copies
        for i in range(agents):
            eng.create_adapter(AdapterCreate(name=f"agent{i}", base="b", seed=i))
        eng.create_adapter(
            AdapterCreate(
                name="critic", base="b", kind="critic", value_head_hidden=[256]
            )
        )
        for name in eng.adapters:  # every agent and the critic run once
            eng.forward(ForwardRequest(adapter=name, data=probe))
        eng.close()
    else:
        import peft

        keep = []
        ids = torch.tensor([probe[0].tokens])
        for _ in range(
            agents + 1
        ):  # the reference: a full model per agent, plus one for the critic
            model, _ = load_smollm2()
            _materialize(model)
            pm = peft.get_peft_model(
                model,
                peft.LoraConfig(
                    r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]
                ),
            )
            with torch.no_grad():
                pm(input_ids=ids)
            keep.append(pm)
    print(json.dumps({"peak_rss_bytes": _hwm_bytes()}))


def _hwm_bytes() -> int:
    """Peak RSS of this process image. (ru_maxrss would not do: Linux carries the parent's peak across
    fork + exec, so every child would report at least the benchmark's own size.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss(layout: str, agents: int) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", layout, str(agents)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_bytes"])


def bench_memory(counts: list[int]) -> dict[str, float]:
    load_smollm2()  # make sure the cache exists before timing anything
    res: dict[str, float] = {}
    for n in counts:
        ours, ref = peak_rss("ours", n), peak_rss("reference", n)
        res[f"memory_ours_{n}_agents_bytes"] = float(ours)
        res[f"memory_reference_{n}_agents_bytes"] = float(ref)
        res[f"memory_ratio_{n}_agents"] = ours / ref
    return res


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--memory-child":
        memory_child(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="fewer repetitions and shorter training sequences",
    )
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (0 = torch's default). 1 by default: on a shared, loaded machine more threads "
        "stall in OpenMP barriers and the figures become noise; both sides of every ratio use the same",
    )
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=989.0,
        help="dense bf16 peak of the GPU, for MFU",
    )
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.time()
    reps = 1 if args.quick else 3
    results: dict[str, object] = {
        "device": args.device,
        "quick": args.quick,
        "torch_threads": torch.get_num_threads(),
    }
    batch, new_tokens = 16, 32
    results.update(bench_sampling(args.device, batch, new_tokens, reps))
    results["sampling_batch"], results["sampling_new_tokens"] = batch, new_tokens
    tb, ts = (2, 64) if args.quick else (8, 256)
    if args.device == "cuda":
        tb, ts = 16, 512
    # fp32 on CPU: `auto` is bf16 on a CPU with native bf16, and bf16 is measured beside it
    train_dtype = "float32" if args.device == "cpu" else "auto"
    train = bench_training(
        args.device, SMOL, tb, ts, 1 if args.quick else 4, train_dtype
    )
    results["train_tokens_per_s"] = train["train_tokens_per_s"]
    results["train_batch"], results["train_seq_len"] = tb, ts
    if (
        args.device == "cpu"
    ):  # bf16 autocast on CPU (fast where the CPU has AVX512_BF16 / AMX)
        bf = bench_training("cpu", SMOL, tb, ts, 1 if args.quick else 4, "bfloat16")
        results["train_bf16_tokens_per_s"] = bf["train_tokens_per_s"]
        results["train_bf16_vs_fp32"] = (
            bf["train_tokens_per_s"] / train["train_tokens_per_s"]
        )
    if args.device == "cuda":
        big = bench_training("cuda", "tiny:qwen2-0.5b", 16, 1024, 5, "bfloat16")
        flops = 4 * big["num_parameters"] * big["train_tokens_per_s"]
        results["train_0_5b_tokens_per_s"] = big["train_tokens_per_s"]
        results["train_mfu"] = flops / (args.peak_tflops * 1e12)
    if not args.skip_memory:
        results.update(bench_memory([1, 2, 4, 8]))
    results["seconds"] = time.time() - t_start

    Path(args.out).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"{'figure':40s} value")
    for k, v in sorted(results.items()):
        print(f"{k:40s} {v:.4g}" if isinstance(v, float) else f"{k:40s} {v}")


if __name__ == "__main__":
    main()
