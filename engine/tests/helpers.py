"""Helpers shared by the engine tests."""

from __future__ import annotations

import torch

from marft_engine import lora_batch
from marft_engine.engine import Engine
from marft_engine.schemas import AdapterCreate, LoraConfig, OptimizerConfig

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def perturb(engine: Engine, name: str, seed: int, scale: float = 0.5) -> None:
    """LoRA B starts at zero (adapter == base); give it random weights so adapters really differ."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in engine.adapters[name].params:
            p.add_(torch.randn(p.shape, generator=g) * scale)
    lora_batch.bump()  # weights changed behind the engine's back


def add_policy(engine: Engine, name: str, base: str = "b", seed: int = 0, lr: float = 1e-2) -> None:
    engine.create_adapter(
        AdapterCreate(
            name=name,
            base=base,
            lora=LoraConfig(r=4, alpha=8, target_modules=TARGETS),
            optimizer=OptimizerConfig(lr=lr),
            seed=seed,
        )
    )
    perturb(engine, name, 1000 + seed)
