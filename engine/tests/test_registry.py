"""Bases and adapters (registry.py): sources, deleting the last adapter, LoRA on some layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import add_policy, seqs

from marft_engine.engine import Engine
from marft_engine.errors import EngineError
from marft_engine.models import load_tiny
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    CheckpointRequest,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    LoraConfig,
    OptimStepRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)


def test_hf_source_and_bad_sources(engine: Engine, tmp_path: Path) -> None:
    model, tok = load_tiny("qwen2", 3)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    engine.create_base(BaseCreate(name="hfb", source=f"hf:{tmp_path / 'm'}", dtype="float32"))
    engine.create_base(BaseCreate(name="tq", source="tiny:qwen2", seed=3, dtype="float32"))
    try:
        probe = [Datum(tokens=s) for s in seqs(2, 8)]
        a = engine.forward(ForwardRequest(adapter="__base__", base="hfb", data=probe)).results
        b = engine.forward(ForwardRequest(adapter="__base__", base="tq", data=probe)).results
        assert a == b
        assert (
            engine.bases["hfb"]
            .tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
            )
            .endswith("<|im_start|>assistant\n")
        )
        for source in (f"hf:{tmp_path}", f"gguf:{tmp_path / 'none.gguf'}", "pkg:other", "s3:x"):
            with pytest.raises(EngineError) as err:
                engine.create_base(BaseCreate(name="bad", source=source))
            assert err.value.status == 400 and err.value.message.startswith("source:")
    finally:
        del engine.bases["hfb"], engine.bases["tq"]


def test_deleting_the_last_adapter_of_a_base_leaves_a_working_base(engine: Engine) -> None:
    engine.create_base(BaseCreate(name="solo", source="tiny:llama", seed=0, dtype="float32"))
    try:
        probe = [Datum(tokens=[1, 2, 3, 4])]
        before = engine.forward(ForwardRequest(adapter="__base__", base="solo", data=probe)).results
        add_policy(engine, "only", base="solo", seed=8)
        engine.delete_adapter("only")
        assert engine.forward(ForwardRequest(adapter="__base__", base="solo", data=probe)).results == before
        sp = SamplingParams(temperature=0, max_new_tokens=3)
        out = engine.sample(
            SampleBatch(
                requests=[SampleRequest(adapter="__base__", base="solo", prompt_ids=[1], sampling=sp)]
            )
        )
        assert len(out.results[0].completions[0].response_ids) == 3
        add_policy(engine, "only", base="solo", seed=8)
        assert engine.forward(ForwardRequest(adapter="only", data=probe)).results != before
        engine.delete_adapter("only")
    finally:
        del engine.bases["solo"]


def test_lora_on_some_layers_only(tmp_path: Path) -> None:
    """lora.layers: LoRA weights only in those layers (negative counts from the last); a critic there
    trains, survives a checkpoint round trip, and a bad index is a 400 naming lora.layers."""
    eng = Engine(device="cpu", checkpoint_root=str(tmp_path))
    try:
        eng.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32"))  # 2 layers
        info = eng.create_adapter(
            AdapterCreate(
                name="top",
                base="b",
                kind="critic",
                lora=LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"], layers=[-1]),
                value_head_hidden=[8],
            )
        )
        assert info.lora.layers == [1]
        names = [n for n, p in eng.bases["b"].peft.named_parameters() if ".top." in n and "lora_" in n]
        assert names and all(".layers.1." in n for n in names), names
        data = [Datum(tokens=s, returns=[1.0] * len(s), old_values=[0.0] * len(s)) for s in seqs(3, 5)]
        before = [p.detach().clone() for p in eng.adapters["top"].params]
        eng.forward_backward(ForwardBackwardRequest(adapter="top", loss="value", data=data))
        eng.optim_step(OptimStepRequest(adapter="top"))
        after = [p.detach().clone() for p in eng.adapters["top"].params]
        assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
        eng.save_checkpoint(CheckpointRequest(path=str(tmp_path / "ck"), adapters=["top"]))
        eng.delete_adapter("top")
        eng.load_checkpoint(CheckpointRequest(path=str(tmp_path / "ck")))
        assert eng.adapters["top"].lora.layers == [1]
        assert all(torch.equal(a, b) for a, b in zip(after, eng.adapters["top"].params, strict=True))
        with pytest.raises(EngineError, match=r"lora\.layers"):
            eng.create_adapter(
                AdapterCreate(name="bad", base="b", lora=LoraConfig(target_modules=["q_proj"], layers=[2]))
            )
    finally:
        eng.close()
