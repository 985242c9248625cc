"""Shared pieces of the speed benchmarks: timing, alternation, the matmul probe, model shapes and
FLOPs, and the workloads (prompts, training data).

The machine these run on is shared: every comparison alternates its sides and takes medians, and the
compute limit is measured in the same run (`matmul_flops`) rather than taken from a datasheet.
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
from marft_engine import kernels as kernels_ext
from marft_engine import precision
from marft_engine.engine import Engine
from marft_engine.schemas import Datum, ForwardBackwardRequest, ForwardRequest

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def alternate(
    sides: dict[str, Callable[[], Any]], reps: int, device: str
) -> dict[str, float]:
    """Median seconds of each side, the sides run in turn `reps` times."""
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(reps):
        for k, fn in sides.items():
            times[k].append(timed(fn, device))
    return {k: statistics.median(v) for k, v in times.items()}


def gemm_kernels(
    a: torch.Tensor, b: torch.Tensor
) -> dict[str, Callable[[], torch.Tensor]]:
    """The dense products a @ b.T this machine offers PyTorch: `torch.matmul` (MKL's sgemm for fp32 on
    a CPU), the engine's panel kernel where it has one (fp32 on a CPU with AVX2 but no AVX512; bf16,
    `panels_bf16`, on a CPU with AVX512_BF16 and no AMX: precision.py) and, on a CPU with oneDNN, oneDNN's inner product on a prepacked weight. Why: on AMD
    CPUs MKL's sgemm takes a path well short of AVX512 (2026-12-04, Zen 5: ~100 against oneDNN's
    ~240 GFLOP/s on one core), so a probe of `torch.matmul` alone understates the hardware."""
    kernels: dict[str, Callable[[], torch.Tensor]] = {"matmul": lambda: a @ b.T}
    if a.device.type == "cpu" and a.dtype == torch.float32 and precision.panels_apply():
        panels = precision.pack_weight(b)  # the engine's own kernel (precision.Panels)
        assert isinstance(panels, precision.Panels)
        kernels["panels"] = lambda: precision.packed_linear(a, panels, None)
    if (
        a.device.type == "cpu"
        and a.dtype == torch.bfloat16
        and precision.bf16_panels_apply()
    ):
        k = kernels_ext.load()
        assert k is not None
        bf16_panels = k.pack_panels_bf16(b)
        x = a.float()  # the kernel takes fp32 rows and rounds them to bf16 itself
        kernels["panels_bf16"] = lambda: k.panel_linear_bf16(x, bf16_panels, b.shape[0])
    if a.device.type == "cpu" and torch.backends.mkldnn.is_available():
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(b, a.shape[0])
        except (
            RuntimeError
        ):  # no oneDNN kernel of this dtype for this CPU (bf16 without AVX512)
            return kernels
        kernels["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(
            a, packed, None, "none", [], ""
        )
    return kernels


def matmul_flops(
    dtype: torch.dtype, device: str, n: int = 1024, reps: int = 5
) -> float:
    """Dense GEMM FLOP/s: n x n x n products, the median of `reps` after two warm-ups, for the
    fastest of `gemm_kernels`."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = 0.0
    for fn in gemm_kernels(a, b).values():
        for _ in range(2):
            fn()
        seconds = statistics.median(timed(fn, device) for _ in range(reps))
        best = max(best, 2 * n**3 / seconds)
    return best


def read_bandwidth(device: str, mib: int = 1024, reps: int = 5) -> float:
    """Bytes/s a pass can read from memory: the sum of an fp32 tensor several times larger than the
    caches, the median of `reps` after a warm-up. The other limit of a decode step, which reads every
    weight and its rows' keys and values once. (gpu_bench.py's `bandwidth` times a device copy.)"""
    x = torch.ones(mib * 2**20 // 4, device=device)
    x.sum()
    seconds = statistics.median(timed(x.sum, device) for _ in range(reps))
    return x.numel() * 4 / seconds


def linear_seconds(
    model: torch.nn.Module, rows: int, reps: int = 5
) -> dict[str, float]:
    """Seconds for every base linear weight of the model (LoRA apart, the LM head included) applied
    to `rows` rows once, as a decode step at batch `rows` applies them, per kernel of `gemm_kernels`:
    how far the engine's kernel (`panels` where there is one, else `matmul` in fp32; in bf16,
    `panels_bf16` in the fused decode step where there are bf16 panels, else `onednn`; precision.py)
    is from the fastest. Median of `reps` after a warm-up."""
    weights = [
        m.weight.detach()
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and "lora_" not in n
    ]
    w0 = weights[0]
    products = [
        gemm_kernels(torch.randn(rows, w.shape[1], device=w.device).to(w.dtype), w)
        for w in weights
    ]
    out: dict[str, float] = {}
    for name in products[0]:
        step = _in_turn([k[name] for k in products])
        step()
        out[name] = statistics.median(timed(step, w0.device.type) for _ in range(reps))
    return out


def _in_turn(fns: list[Callable[[], torch.Tensor]]) -> Callable[[], None]:
    """One callable that runs fns one after another."""

    def run() -> None:
        for f in fns:
            f()

    return run


def shape(model: torch.nn.Module) -> dict[str, float]:
    """Weights of the linear layers (LM head apart) and of the head, layers, hidden and KV size."""
    head = model.get_output_embeddings()
    linear = sum(
        m.weight.numel()
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
        and m is not head
        and "lora_" not in type(m).__name__.lower()
    )
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    cfg = model.config.get_text_config()
    head_dim = (
        getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    )
    return {
        "linear": float(linear - lora),
        "head": float(head.weight.numel()),
        "lora": float(lora),
        "layers": float(cfg.num_hidden_layers),
        "q_width": float(cfg.num_attention_heads * head_dim),
        "kv_width": float(
            (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
            * head_dim
        ),
    }


def decode_step_bytes(
    s: dict[str, float], weight_width: int, cache_width: int, rows: int, context: float
) -> float:
    """Bytes a decode step of `rows` rows reads: every weight once (LoRA apart, `weight_width` bytes
    each) and each row's keys and values over `context` positions in every layer (`cache_width`)."""
    weights = (s["linear"] + s["head"]) * weight_width
    return weights + rows * context * 2 * s["layers"] * s["kv_width"] * cache_width


def attention_flops(s: dict[str, float], context: float) -> float:
    """Per token: scores and the weighted sum of values over `context` positions, every layer."""
    return 4 * s["layers"] * s["q_width"] * context


def sampling_flops(
    s: dict[str, float],
    prefill_tokens: float,
    prompt: float,
    rows: int,
    decode_tokens: float,
    context: float,
) -> float:
    """Model FLOPs of a sampling call: the prefilled tokens through the trunk (prompts of mean length
    `prompt`), the head at each row's last prompt position, then the decoded tokens through trunk
    and head at a mean context of `context`."""
    prefill = (
        prefill_tokens * (2 * s["linear"] + attention_flops(s, prompt / 2))
        + rows * 2 * s["head"]
    )
    return prefill + decode_tokens * (
        2 * (s["linear"] + s["head"]) + attention_flops(s, context)
    )


def left_padded(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch for `generate`: ids [B, L] and attention mask [B, L], each prompt right-aligned."""
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :], mask[i, L - len(p) :] = torch.tensor(p), 1
    return ids.to(device), mask.to(device)


def prompts_of(tok: Any, system: str, users: list[str]) -> list[list[int]]:
    out = []
    for u in users:
        ids = tok.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": u}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        out.append(
            [int(t) for t in (ids["input_ids"] if isinstance(ids, dict) else ids)]
        )
    return out


def problems(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    names = ["Tom", "Ana", "Li", "Sara", "Ravi", "Mia", "Ken", "Zoe"]
    things = ["apples", "books", "coins", "pens", "cards", "shells"]
    out = []
    for i in range(n):
        a, b = (int(x) for x in torch.randint(2, 60, (2,), generator=g))
        out.append(
            f"{names[i % 8]} has {a} {things[i % 6]} and gets {b} more. How many {things[i % 6]} now?"
        )
    return out


def demo_data(tok_vocab: int, n: int, seed: int) -> list[Datum]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = int(torch.randint(60, 101, (1,), generator=g))
        r = int(torch.randint(12, 21, (1,), generator=g))
        toks = torch.randint(0, min(tok_vocab, 32000), (p + r,), generator=g).tolist()
        out.append(
            Datum(
                tokens=toks,
                weights=[0.0] * p + [1.0] * r,
                old_logprobs=[-5.0] * (p + r),
                advantages=torch.randn(p + r, generator=g).tolist(),
            )
        )
    return out


def few_shot(n: int) -> str:
    """n worked examples, the same in every prompt (12: about 300 SmolLM2 tokens)."""
    return " ".join(
        f"Example {i}: {p} Answer: {i * 7 % 50 + 3}."
        for i, p in enumerate(problems(n, 99))
    )


def ab_arguments(doc: str, source: str) -> argparse.ArgumentParser:
    """The options every in-process A/B script of bench/ takes (packing_ab.py, train_ab.py)."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--source", default=source)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default=None)
    return ap


def ab_dtypes(dtypes: str, script: str) -> list[str]:
    """The --dtypes of an A/B script, less bf16 where the CPU has no native bf16 (said so): there it
    runs dozens of times slower than fp32, which nobody would run."""
    out = dtypes.split(",")
    if "bfloat16" in out and not precision.native_bf16():
        print(f"{script}: no native bf16 on this CPU; fp32 only")
        out.remove("bfloat16")
    return out


def paired_speedup(before: list[float], after: list[float]) -> float:
    """The median of the paired ratios before / after (rounds taken in turn, so each pair shares the
    machine's state of the moment)."""
    return statistics.median(b / a for b, a in zip(before, after, strict=True))


def paired_figures(
    dtype: str,
    label: str,
    sides: tuple[str, str],
    before: list[float],
    after: list[float],
) -> dict[str, float]:
    """An in-process A/B's figures from its rounds' seconds (the first round, a warm-up, dropped):
    each side's median and the paired speedup, named `label_side_s` and `label_speedup`; prints
    the rounds."""
    before, after = before[1:], after[1:]
    print(
        f"{dtype} {label}: {sides[0]} {[round(x, 3) for x in before]} {sides[1]} {[round(x, 3) for x in after]}",
        flush=True,
    )
    return {
        f"{label}_{sides[0]}_s": statistics.median(before),
        f"{label}_{sides[1]}_s": statistics.median(after),
        f"{label}_speedup": paired_speedup(before, after),
    }


def ppo_results(eng: Engine, adapter: str, data: list[Datum]) -> list[torch.Tensor]:
    """One PPO `forward_backward` of `adapter` on `data`: [the loss, every gradient], the gradients
    then cleared, for an A/B script to compare its sides by."""
    params = eng.adapters[adapter].params
    out = eng.forward_backward(
        ForwardBackwardRequest(adapter=adapter, loss="ppo", data=data)
    )

    def take() -> list[torch.Tensor]:
        g = [torch.tensor([out.loss])] + [
            p.grad.clone() for p in params if p.grad is not None
        ]
        for p in params:
            p.grad = None
        return g

    return eng.compute.call(take)


def logprob_results(eng: Engine, adapter: str, data: list[Datum]) -> list[torch.Tensor]:
    """`forward`'s log-probs of `adapter` on `data`, one tensor a datum."""
    res = eng.forward(ForwardRequest(adapter=adapter, data=data)).results
    return [torch.tensor(r.logprobs or []) for r in res]


def write_figures(res: dict[str, float], out: str | None) -> None:
    """Print the figures by name; write them to `out` as JSON where given."""
    for k, v in sorted(res.items()):
        print(f"{k:40s} {v:.4g}")
    if out:
        Path(out).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
