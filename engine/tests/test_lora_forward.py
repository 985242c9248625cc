"""A LoRA layer's forward through its active adapters (lora_batch._active_forward) against PEFT's own:
the scaling applied to the rank-r intermediate, and no cast to fp32 under autocast, give PEFT's
bits where the scaling is a power of two, and agree within rounding otherwise; in values and in
gradients, in fp32 and under bf16 autocast."""

from __future__ import annotations

import peft
import pytest
import torch

from marft_engine import lora_batch


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(48, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def lora_layer(alpha: float, adapters: int = 1) -> torch.nn.Module:
    torch.manual_seed(0)
    model = peft.get_peft_model(Net(), peft.LoraConfig(r=4, lora_alpha=alpha, target_modules=["proj"]))
    for i in range(1, adapters):
        model.add_adapter(f"extra{i}", peft.LoraConfig(r=8, lora_alpha=alpha, target_modules=["proj"]))
    layer = model.base_model.model.proj
    with torch.no_grad():
        for b in layer.lora_B.values():  # PEFT starts B at zero, which would hide the LoRA term
            b.weight.normal_()
    if adapters > 1:
        layer.set_adapter(["default", *(f"extra{i}" for i in range(1, adapters))])
    return layer


def both(layer: torch.nn.Module, x: torch.Tensor, bf16: bool) -> list[tuple[torch.Tensor, ...]]:
    """(output, input gradient, every LoRA weight's gradient) of the shipped forward and of PEFT's."""
    out = []
    for forward in (lambda v: layer(v), lambda v: lora_batch._original_forward(layer, v)):
        for p in layer.parameters():
            p.grad = None
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = forward(xi)
        y.float().pow(2).sum().backward()
        lora = [p.grad for n, p in layer.named_parameters() if "lora_" in n]
        assert all(g is not None for g in lora)
        out.append((y.detach(), xi.grad, *lora))
    return out


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("adapters", [1, 2])
def test_power_of_two_scaling_gives_pefts_bits(bf16: bool, adapters: int) -> None:
    lora_batch.install()
    layer = lora_layer(alpha=8.0, adapters=adapters)  # scaling 2 (r 4) and 1 (r 8)
    x = torch.randn(3, 5, 48)
    if bf16:
        x = x.bfloat16()  # an input already in the autocast dtype: PEFT casts it to fp32 and back
    ours, theirs = both(layer, x, bf16)
    assert ours[0].dtype == theirs[0].dtype == (torch.bfloat16 if bf16 else torch.float32)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_other_scalings_agree_within_rounding() -> None:
    lora_batch.install()
    layer = lora_layer(alpha=5.0)  # scaling 1.25
    ours, theirs = both(layer, torch.randn(3, 5, 48), bf16=False)
    assert not all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))  # another rounding
    for a, b in zip(ours, theirs, strict=True):
        # rounding scales with the sizes of the summed terms, not with each sum: a small entry of
        # LoRA A's gradient (a sum over terms of hundreds) differed by 1.8e-4 on a Zen 4 CPU
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6 * b.abs().max().item())


def test_disabled_adapters_and_the_mixed_path_keep_pefts_forward() -> None:
    lora_batch.install()
    layer = lora_layer(alpha=8.0)
    x = torch.randn(2, 3, 48)
    with torch.no_grad():
        base = layer.base_layer(x)
        layer.enable_adapters(False)  # what PEFT's disable_adapter() context does to each layer
        try:
            assert torch.equal(layer(x), base)
        finally:
            layer.enable_adapters(True)
        assert not torch.equal(layer(x), base)
        assert torch.equal(layer(x, adapter_names=["__base__", "__base__"]), base)
