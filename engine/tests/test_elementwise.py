"""The fused decode layer's RMS norm and SiLU-gated MLP middle (csrc/elementwise.cpp) against
PyTorch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from marft_engine import kernels

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="no C++ compiler here")


@pytest.mark.parametrize("shape", [(1, 1), (3, 7, 64), (5, 576), (2, 1000, 33)])
def test_kernels_equal_pytorch_within_fp32_rounding(shape: tuple[int, ...]) -> None:
    k = kernels.load()
    assert k is not None
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g) * 3
    w = torch.randn(shape[-1], generator=g)
    want = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(k.rms_norm(x, w, 1e-5), want, rtol=1e-5, atol=1e-6)
    u = torch.randn(shape, generator=g)
    x = x * 10  # large gates: the exponential's range
    torch.testing.assert_close(k.silu_mul(x, u), F.silu(x) * u, rtol=1e-5, atol=1e-6)
    assert not torch.equal(k.silu_mul(x, u), F.silu(u) * x)  # the arguments' roles matter
