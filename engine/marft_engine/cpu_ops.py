"""One-pass element-wise steps for the passes of a CPU base that run without gradients in fp32
(prefill, `forward`): the RMS norms and the SiLU-gated MLP's middle of Llama and Qwen2 layers, by the
engine's C++ kernels (csrc/elementwise.cpp).

Why: PyTorch runs an RMS norm as five passes over the rows and silu(gate) * up as two, each writing a
tensor the size of its input; at a prefill's thousands of rows these passes were a noticeable share
of the pass next to its products (docs/MEASUREMENTS.md). Passes with gradients (training), under
autocast (bf16) or without the kernels keep Hugging Face's own forward; results agree within fp32
rounding (tests/test_cpu_ops.py).
"""

from __future__ import annotations

import types

import torch
from transformers import PreTrainedModel

from . import kernels

NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm")  # x / rms(x) * w, weight not offset (Gemma's is 1 + w)
MLPS = ("LlamaMLP", "Qwen2MLP")  # down(act(gate(x)) * up(x))


def install(model: PreTrainedModel) -> int:
    """Give the RMS norms and SiLU MLPs of a CPU model the one-pass forward for passes without
    gradients in fp32 (module docstring). Returns how many modules took it; 0 without the kernels."""
    if kernels.load() is None:
        return 0
    n = 0
    for m in model.modules():
        name = type(m).__name__
        if name in NORMS:
            m.forward = types.MethodType(_norm_forward, m)  # type: ignore[method-assign]
            n += 1
        elif name in MLPS and getattr(m.config, "hidden_act", None) == "silu":
            m.forward = types.MethodType(_mlp_forward, m)  # type: ignore[method-assign]
            n += 1
    return n


def _takes(x: torch.Tensor) -> bool:
    return (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
    )


def _norm_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x [..., d] -> [..., d]: the norm, by the kernel where `_takes` x."""
    if _takes(x) and self.weight.dtype == torch.float32:
        k = kernels.load()
        assert k is not None
        return k.rms_norm(x, self.weight, float(self.variance_epsilon))
    return type(self).forward(self, x)  # Hugging Face's (the class's; the instance's is this one)


def _mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x [..., d] -> [..., d]: down(silu(gate(x)) * up(x)), the middle by the kernel where `_takes` x."""
    if not _takes(x):
        return type(self).forward(self, x)  # Hugging Face's
    gate, up = self.gate_proj(x), self.up_proj(x)
    k = kernels.load()
    assert k is not None
    return self.down_proj(k.silu_mul(gate, up))
