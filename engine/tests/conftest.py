"""Shared fixtures: an in-process engine on CPU with the tiny random-init Llama."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from helpers import TARGETS, add_policy, perturb

from marft_engine.engine import Engine
from marft_engine.schemas import AdapterCreate, BaseCreate, LoraConfig, OptimizerConfig

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def engine() -> Engine:
    e = Engine(device="cpu", max_batch=64)
    e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0))
    add_policy(e, "A", seed=1)
    add_policy(e, "B", seed=2)
    e.create_adapter(
        AdapterCreate(
            name="C",
            base="b",
            kind="critic",
            lora=LoraConfig(r=4, alpha=8, target_modules=TARGETS),
            optimizer=OptimizerConfig(lr=1e-2),
            value_head_hidden=[16],
            seed=3,
        )
    )
    perturb(e, "C", 1003, scale=0.1)
    yield e
    e.close()
