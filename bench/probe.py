"""Shared pieces of the speed benchmarks: timing, alternation, the matmul probe, model shapes.

The machine these run on is shared: every comparison alternates its sides and takes medians, and the
compute limit is measured in the same run (`matmul_flops`) rather than taken from a datasheet.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

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


def matmul_flops(
    dtype: torch.dtype, device: str, n: int = 1024, reps: int = 5
) -> float:
    """Dense GEMM FLOP/s: the median of `reps` n x n x n products after two warm-ups."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(2):
        a @ b
    return (
        2 * n**3 / statistics.median(timed(lambda: a @ b, device) for _ in range(reps))
    )


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
    }


def attention_flops(s: dict[str, float], context: float) -> float:
    """Per token: scores and the weighted sum of values over `context` positions, every layer."""
    return 4 * s["layers"] * s["q_width"] * context


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
