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
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    # checkpoints go to the tests' tmp_path directories, all under pytest's base temp
    e = Engine(device="cpu", max_batch=64, checkpoint_root=str(tmp_path_factory.getbasetemp()))
    e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32"))
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
