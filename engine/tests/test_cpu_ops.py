"""The one-pass RMS norm and SiLU-gated MLP middle (cpu_ops.py, csrc/elementwise.cpp) against
PyTorch's, and where the engine takes them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import PARITY_TOL, ppo_data, seqs

from marft_engine import cpu_ops, kernels
from marft_engine.engine import Engine
from marft_engine.schemas import Datum, ForwardBackwardRequest, ForwardRequest

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


def test_forward_takes_them_and_training_does_not(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """`forward` over an adapter's LoRA gives the log-probs it gives without the kernels, within the
    parity tolerance, having run them in every layer; a training pass never runs them."""
    calls: list[str] = []
    for name in ("rms_norm", "silu_mul"):
        fn = getattr(kernels.load(), name)
        monkeypatch.setattr(kernels.load(), name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    data = [Datum(tokens=s) for s in seqs(5, 3)]
    fast = engine.forward(ForwardRequest(adapter="A", data=data)).results
    layers = engine.bases["b"].hf.config.num_hidden_layers
    assert calls.count("silu_mul") >= layers and calls.count("rms_norm") >= 2 * layers + 1
    train = ppo_data(engine, "A", 4)  # its old log-probs by `forward`, which runs them
    calls.clear()
    engine.forward_backward(ForwardBackwardRequest(adapter="A", loss="ppo", data=train))
    assert not calls
    monkeypatch.setattr(cpu_ops, "_takes", lambda x: False)
    calls.clear()
    plain = engine.forward(ForwardRequest(adapter="A", data=data)).results
    assert not calls
    for x, y in zip(fast, plain, strict=True):
        torch.testing.assert_close(
            torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=PARITY_TOL, rtol=0
        )
