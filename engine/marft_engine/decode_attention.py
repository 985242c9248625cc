"""The attention of a CPU decode step: a small C++ kernel (csrc/decode_attention.cpp), built once.

A decode step's attention reads every row's keys and values once and does little arithmetic on them
(a few query positions a row), so it is bound by reading the cache. PyTorch's CPU flash kernel reads it
at about half the rate of a plain sum over the same tensors, and at a rollout's contexts (20 rows over
~400 columns) attention was a quarter of a decode step (docs/MEASUREMENTS.md). The kernel reads each key
and value once for its whole group of query heads, with the arithmetic vectorized by the compiler.

It is built with the engine's other CPU kernels (kernels.py) and applies to the sampler's decode
steps: passes without gradients on a CPU that feed at most MAX_QUERIES positions a row after a KV
cache with fp32 keys and values (an fp32 base's), or bf16 ones (a bf16 base's, precision.place: half
the bytes to read), which it reads as the fp32 numbers they are. Passes over whole sequences
(prefill, `forward`, training) keep SDPA. Where it cannot
be built (no C++ compiler), or with MARFT_DECODE_KERNEL=0, decoding keeps SDPA: the same results within
fp32 rounding (tests/test_decode_attention.py).
"""

from __future__ import annotations

import os

import torch

from . import kernels

MAX_QUERIES = 64  # query positions a row (a decode step: 1, with drafts up to speculative.STEP_POSITIONS)

ENABLED = os.environ.get("MARFT_DECODE_KERNEL", "1") != "0"  # the bench's A/B flips it in-process


def attend(
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, Hk, L, D]
    value: torch.Tensor,  # [B, Hk, L, D]
    mask: torch.Tensor | None,  # [B, 1, T, L] bool, True = attend
    scaling: float | None,
) -> torch.Tensor | None:
    """softmax(q k^T * scaling + mask) v as [B, T, H, D] fp32 by the kernel, or None where it does
    not apply (a GPU, gradients, keys and values neither both fp32 nor both bf16, no bool mask, no
    cache, more than MAX_QUERIES positions, or no kernel): the caller then runs SDPA."""
    B, H, T, D = query.shape
    if not (
        ENABLED
        and query.device.type == "cpu"
        and not torch.is_grad_enabled()
        and T <= MAX_QUERIES
        and T < key.shape[2]  # it reads a KV cache (a pass over a whole sequence has T = L)
        and key.dtype in (torch.float32, torch.bfloat16)
        and value.dtype == key.dtype
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
    k = kernels.load()
    if k is None:
        return None
    keep = mask.expand(B, 1, T, key.shape[2]).reshape(B, T, -1).contiguous()  # [B, T, L]
    return k.decode_attention(
        query.float().contiguous(), key, value, keep, D**-0.5 if scaling is None else float(scaling)
    )
