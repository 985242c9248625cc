"""Checkpoints (checkpoints.py): round trip, resumed training bit for bit, PEFT folders."""

from __future__ import annotations

from pathlib import Path

import peft
import torch
from helpers import add_policy, seqs, train_steps

from marft_engine import losses
from marft_engine.engine import Engine
from marft_engine.models import load_tiny
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    CheckpointRequest,
    Datum,
    ForwardRequest,
)


def test_checkpoint_round_trip_and_continued_training(engine: Engine, tmp_path: Path) -> None:
    add_policy(engine, "ck", seed=4)
    train_steps(engine, "ck", 50, 2)
    ck = tmp_path / "ckpt"
    engine.save_checkpoint(CheckpointRequest(path=str(ck), adapters=["ck", "C"]))
    assert sorted(p.name for p in (ck / "adapters" / "ck").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
    ]
    assert sorted(p.name for p in ck.iterdir()) == [
        "adapters",
        "manifest.json",
        "rng.json",
        "rng.safetensors",
    ]
    assert (ck / "adapters" / "C" / "value_head.safetensors").is_file()
    assert not list(tmp_path.glob("*.tmp-*"))
    uninterrupted = train_steps(engine, "ck", 60, 2)
    assert engine.adapters["ck"].version == 4
    engine.load_checkpoint(CheckpointRequest(path=str(ck)))
    assert engine.adapters["ck"].version == 2
    resumed = train_steps(engine, "ck", 60, 2)
    assert resumed == uninterrupted  # bit for bit

    # a fresh engine creates the missing adapters on its already-loaded base
    fresh = Engine(device="cpu", checkpoint_root=str(engine.checkpoint_root))
    try:
        fresh.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32"))
        engine.load_checkpoint(CheckpointRequest(path=str(ck)))
        fresh.load_checkpoint(CheckpointRequest(path=str(ck)))
        assert fresh.adapters["C"].kind == "critic" and fresh.adapters["ck"].version == 2
        probe = [Datum(tokens=s) for s in seqs(2, 5)]
        for name in ("ck", "C"):
            a = engine.forward(ForwardRequest(adapter=name, data=probe)).results
            b = fresh.forward(ForwardRequest(adapter=name, data=probe)).results
            assert a == b
        assert train_steps(fresh, "ck", 60, 2) == resumed
    finally:
        fresh.close()

    # the PEFT folder loads with plain transformers + peft
    plain, _ = load_tiny("llama", 0)
    engine.load_checkpoint(CheckpointRequest(path=str(ck), adapters=["ck"]))
    pm = peft.PeftModel.from_pretrained(plain, str(ck / "adapters" / "ck")).eval()
    s = seqs(1, 77)[0]
    ids = torch.tensor([s])
    with torch.no_grad():
        expect = losses.logprobs_and_entropies(pm(ids).logits, ids, 1.0)[0][0]
    got = engine.forward(ForwardRequest(adapter="ck", data=[Datum(tokens=s)])).results[0].logprobs
    assert torch.allclose(torch.tensor(got), expect, atol=1e-6)
    # init_from a PEFT folder gives the same adapter
    engine.create_adapter(AdapterCreate(name="ck2", base="b", init_from=str(ck / "adapters" / "ck")))
    got2 = engine.forward(ForwardRequest(adapter="ck2", data=[Datum(tokens=s)])).results[0].logprobs
    assert got2 == got
    engine.delete_adapter("ck2")
    engine.delete_adapter("ck")
