"""The attention of a CPU decode step: a small C++ kernel (csrc/decode_attention.cpp), built once.

A decode step's attention reads every row's keys and values once and does little arithmetic on them
(a few query positions a row), so it is bound by reading the cache. PyTorch's CPU flash kernel reads it
at about half the rate of a plain sum over the same tensors, and at a rollout's contexts (20 rows over
~400 columns) attention was a quarter of a decode step (docs/MEASUREMENTS.md). The kernel reads each key
and value once for its whole group of query heads, with the arithmetic vectorized by the compiler.

It is compiled for this CPU (`-march=native`) by `torch.utils.cpp_extension` into the model cache
(`kernel`; `make setup` builds it, a cache hit costs about a second) and applies to the sampler's decode
steps: passes without gradients on a CPU that feed at most MAX_QUERIES positions a row after a KV
cache with fp32 keys and values (the cache every CPU base decodes from). Passes over whole sequences
(prefill, `forward`, training) keep SDPA. Where it cannot
be built (no C++ compiler), or with MARFT_DECODE_KERNEL=0, decoding keeps SDPA: the same results within
fp32 rounding (tests/test_decode_attention.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from types import ModuleType

import torch

from .models import cache_root

log = logging.getLogger("marft.engine")

SOURCE = Path(__file__).with_name("csrc") / "decode_attention.cpp"
# -ffast-math: vectorized reductions and exp (the kernel keeps every value finite, as that assumes).
# -fopenmp: at::parallel_for is inlined here and splits the rows over torch's threads with OpenMP
# (without it, one thread).
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
MAX_QUERIES = 64  # query positions a row (a decode step: 1, with drafts up to speculative.STEP_POSITIONS)

ENABLED = os.environ.get("MARFT_DECODE_KERNEL", "1") != "0"  # the bench's A/B flips it in-process
_lock = threading.Lock()
_built: list[ModuleType | None] = []  # [] until the first try; then [module] or [None] (failed)


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo; empty where there is none (not Linux)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _name() -> str:
    """The extension's name: the source, the flags, torch and this CPU (-march=native) in a hash, so a
    cached build never runs on a CPU or torch it was not built for."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join([*CFLAGS, torch.__version__, *sorted(cpu_flags())]).encode())
    return f"marft_decode_attention_{h.hexdigest()[:16]}"


def kernel() -> ModuleType | None:
    """The compiled kernel, built on first use (tens of seconds) or loaded from the cache; None where
    it cannot be built (logged once)."""
    if _built:  # every decode step's every layer asks: no lock once settled
        return _built[0]
    with _lock:
        if not _built:
            from torch.utils import cpp_extension  # imported when first needed: it is slow to import

            name = _name()
            folder = cache_root() / "torch_extensions" / name
            try:
                folder.mkdir(parents=True, exist_ok=True)
                mod = cpp_extension.load(
                    name=name,
                    sources=[str(SOURCE)],
                    extra_cflags=CFLAGS,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(folder),
                    verbose=False,
                )
                _built.append(mod)
            except Exception as e:  # no compiler, no ninja, a failed build: decode keeps SDPA
                log.warning("decode attention kernel unavailable, decoding with SDPA: %s", e)
                _built.append(None)
        return _built[0]


def attend(
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, Hk, L, D]
    value: torch.Tensor,  # [B, Hk, L, D]
    mask: torch.Tensor | None,  # [B, 1, T, L] bool, True = attend
    scaling: float | None,
) -> torch.Tensor | None:
    """softmax(q k^T * scaling + mask) v as [B, T, H, D] fp32 by the kernel, or None where it does
    not apply (a GPU, gradients, bf16 keys or values, no bool mask, no cache, more than MAX_QUERIES
    positions, or no kernel): the caller then runs SDPA."""
    B, H, T, D = query.shape
    if not (
        ENABLED
        and query.device.type == "cpu"
        and not torch.is_grad_enabled()
        and T <= MAX_QUERIES
        and T < key.shape[2]  # it reads a KV cache (a pass over a whole sequence has T = L)
        and key.dtype == torch.float32
        and value.dtype == torch.float32
        and key.stride(-1) == 1
        and value.stride(-1) == 1
        and mask is not None
        and mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[1] == 1
        and mask.shape[-1] == key.shape[2]
        and H % key.shape[1] == 0
    ):
        return None
    k = kernel()
    if k is None:
        return None
    keep = mask.expand(B, 1, T, key.shape[2]).reshape(B, T, -1).contiguous()  # [B, T, L]
    return k.decode_attention(
        query.float().contiguous(), key, value, keep, D**-0.5 if scaling is None else float(scaling)
    )
