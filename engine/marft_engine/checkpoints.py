"""Checkpoints: adapters (LoRA weights as PEFT folders, value heads, optimizer state, versions) and the
engine's RNG states, written atomically. Bases are recorded by source and seed, not saved: a load
needs them created first.

    <path>/manifest.json                       format, adapters (base, kind, config, version, lr), bases
    <path>/rng.pt                              torch / python / numpy (/ cuda) RNG states
    <path>/adapters/<name>/adapter_config.json, adapter_model.safetensors   (peft_folder.py)
    <path>/adapters/<name>/value_head.safetensors                          (critics)
    <path>/adapters/<name>/optimizer.pt
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
from pathlib import Path

import numpy as np
import peft
import torch
from safetensors.torch import load_file, save_file

from . import lora_batch
from .errors import BadRequest
from .peft_folder import read_peft_dir, write_peft_dir
from .registry import Registry
from .schemas import AdapterCreate, CheckpointRequest, CheckpointResponse, LoraConfig, OptimizerConfig


def save(registry: Registry, body: CheckpointRequest) -> CheckpointResponse:
    names = body.adapters if body.adapters is not None else list(registry.adapters)
    for i, n in enumerate(names):
        registry.get_adapter(n, f"adapters[{i}]")
    target = Path(body.path)
    parent = target.parent
    if not parent.is_dir():
        raise BadRequest(f"path: parent directory {str(parent)!r} does not exist")
    tmp = parent / f"{target.name}.tmp-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
        adapters: dict[str, dict[str, object]] = {}
        bases: dict[str, dict[str, object]] = {}
        for n in names:
            a = registry.adapters[n]
            assert a.base.peft is not None
            d = tmp / "adapters" / n
            write_peft_dir(a.base.peft, n, a.base.source, d)
            if a.value_head is not None:
                save_file(
                    {k: v.detach().cpu().contiguous() for k, v in a.value_head.state_dict().items()},
                    d / "value_head.safetensors",
                )
            torch.save(a.optimizer.state_dict(), d / "optimizer.pt")
            adapters[n] = {
                "base": a.base.name,
                "kind": a.kind,
                "version": a.version,
                "lr": a.lr,
                "lora": a.lora.model_dump(),
                "optimizer": a.opt.model_dump(),
                "value_head_hidden": a.value_head_hidden,
                "seed": a.seed,
            }
            bases[a.base.name] = {"source": a.base.source, "seed": a.base.seed}
        rng = {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        }
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        manifest = {"format": 1, "adapters": adapters, "bases": bases}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        if target.exists():
            # os.replace cannot swap a directory onto a non-empty one: move the old one aside first.
            old = parent / f"{target.name}.old-{secrets.token_hex(4)}"
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return CheckpointResponse(path=str(target), adapters=names)


def load(registry: Registry, body: CheckpointRequest) -> CheckpointResponse:
    """Load adapters into their (already created) bases, creating the adapters that do not exist."""
    root = Path(body.path)
    mf = root / "manifest.json"
    if not mf.is_file():
        raise BadRequest(f"path: {body.path!r} is not a checkpoint (no manifest.json)")
    manifest = json.loads(mf.read_text())
    names = body.adapters if body.adapters is not None else list(manifest["adapters"])
    for i, n in enumerate(names):
        if n not in manifest["adapters"]:
            raise BadRequest(f"adapters[{i}]: {n!r} is not in the checkpoint")
        b = manifest["adapters"][n]["base"]
        if b not in registry.bases:
            raise BadRequest(
                f"adapters[{i}]: its base {b!r} ({manifest['bases'][b]['source']}) is not loaded; create it first"
            )
    device = registry.device
    for n in names:
        m = manifest["adapters"][n]
        d = root / "adapters" / n
        a = registry.adapters.get(n)
        if a is not None and (a.kind != m["kind"] or a.base.name != m["base"]):
            raise BadRequest(
                f"adapters: {n!r} exists here as a {a.kind} on {a.base.name}; the checkpoint has a {m['kind']} on {m['base']}"
            )
        if a is None:
            a = registry.create_adapter(
                AdapterCreate(
                    name=n,
                    base=m["base"],
                    kind=m["kind"],
                    lora=LoraConfig(**m["lora"]),
                    optimizer=OptimizerConfig(**m["optimizer"]),
                    value_head_hidden=m["value_head_hidden"],
                    seed=m["seed"],
                )
            )
        _, state = read_peft_dir(str(d))
        assert a.base.peft is not None
        peft.set_peft_model_state_dict(a.base.peft, state, adapter_name=n)
        if a.value_head is not None:
            a.value_head.load_state_dict(load_file(d / "value_head.safetensors", device=str(device)))
        for p in a.params:
            p.grad = None
        a.optimizer.load_state_dict(torch.load(d / "optimizer.pt", map_location=device, weights_only=False))
        a.version = int(m["version"])
        a.lr = float(m["lr"])
    lora_batch.bump()
    rng = torch.load(root / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return CheckpointResponse(path=str(root), adapters=names)
