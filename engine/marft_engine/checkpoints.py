"""Checkpoints: adapters (LoRA weights as PEFT folders, value heads, optimizer state, versions) and the
engine's RNG states, written atomically. Bases are recorded by source and seed, not saved: a load
needs them created first.

A checkpoint is data, never code: tensors in safetensors files, everything else in JSON, so loading
one cannot run anything (a pickle can: `torch.load` of an untrusted file executes what it names).

    <path>/manifest.json                       format 2, adapters (base, kind, config, version, lr), bases
    <path>/rng.json, rng.safetensors           python / numpy RNG states; torch (/ cuda) RNG states
    <path>/adapters/<name>/adapter_config.json, adapter_model.safetensors   (peft_folder.py)
    <path>/adapters/<name>/value_head.safetensors                          (critics)
    <path>/adapters/<name>/optimizer.json, optimizer.safetensors           AdamW state

Format 1 (before this one) kept the optimizer and RNG states as pickles (optimizer.pt, rng.pt); they
still load, with `torch.load(weights_only=True)`, which unpickles tensors and plain containers only.

Every path is confined to the checkpoint root the engine was started with: `path` is resolved (a
relative one against the root) through `..` and symlinks and must lie inside it. A save replaces an
existing directory only if it is a MARFT checkpoint.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import secrets
import shutil
from pathlib import Path
from typing import Any, Literal

import numpy as np
import peft
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from . import lora_batch
from .errors import BadRequest, Conflict, Forbidden
from .peft_folder import read_peft_dir, write_peft_dir
from .registry import NAME_RE, Registry
from .schemas import AdapterCreate, CheckpointRequest, CheckpointResponse, LoraConfig, OptimizerConfig

FORMAT = 2


class _AdapterEntry(BaseModel):
    base: str = Field(pattern=NAME_RE.pattern)
    kind: Literal["policy", "critic"]
    version: int = Field(ge=0)
    lr: float = Field(gt=0, allow_inf_nan=False)
    lora: LoraConfig
    optimizer: OptimizerConfig
    value_head_hidden: list[int]
    seed: int


class _BaseEntry(BaseModel):
    source: str
    seed: int


class _Manifest(BaseModel):
    """manifest.json as a load reads it: a crafted or damaged one is a 400, not a KeyError."""

    model_config = ConfigDict(extra="ignore")
    format: Literal[1, 2]
    adapters: dict[str, _AdapterEntry]
    bases: dict[str, _BaseEntry]


def confine(root: Path, path: str, field: str = "path") -> Path:
    """`path` (relative: to `root`) with every `..` and symlink resolved; refused (403, naming the
    field) unless it lies inside the root."""
    if "\x00" in path:
        raise BadRequest(f"{field}: contains a NUL byte")
    root = Path(os.path.realpath(root))
    p = Path(path)
    real = Path(os.path.realpath(p if p.is_absolute() else root / p))
    if any(len(part.encode()) > 255 for part in real.parts) or len(str(real).encode()) >= 4096:
        raise BadRequest(f"{field}: the path is longer than the filesystem allows")
    if real != root and root not in real.parents:
        raise Forbidden(
            f"{field}: {path!r} resolves to {str(real)!r}, outside the checkpoint root {str(root)!r}"
        )
    return real


def is_checkpoint(d: Path) -> bool:
    """Whether d holds a MARFT checkpoint (what a save may replace)."""
    try:
        m = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and m.get("format") in (1, 2) and isinstance(m.get("adapters"), dict)


# ----------------------------------------------------------------------------------------------------
# states as safetensors + JSON


def _optimizer_files(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimizer state_dict as (tensors for safetensors, the rest as JSON)."""
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for pid, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                plain.setdefault(str(pid), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "state": plain}


def _optimizer_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, t in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = t
    for pid, entries in meta.get("state", {}).items():
        state.setdefault(int(pid), {}).update(entries)
    return {"state": state, "param_groups": meta["param_groups"]}


def _rng_files() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    plain = {
        "python": [version, list(words), gauss],
        "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
    }
    return tensors, plain


def _set_rng(tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    version, words, gauss = plain["python"]
    random.setstate((version, tuple(words), gauss))
    name, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    cuda = [tensors[f"cuda.{i}"] for i in range(len(tensors)) if f"cuda.{i}" in tensors]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _legacy_load(f: Path) -> Any:
    """A format-1 pickle, unpickling only tensors, plain containers and numpy's RNG state arrays."""
    allowed = [np.dtype, np.ndarray, np._core.multiarray._reconstruct, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(f, map_location="cpu", weights_only=True)


# ----------------------------------------------------------------------------------------------------


def save(registry: Registry, root: Path, body: CheckpointRequest) -> CheckpointResponse:
    names = body.adapters if body.adapters is not None else list(registry.adapters)
    for i, n in enumerate(names):
        registry.get_adapter(n, f"adapters[{i}]")
    target = confine(root, body.path)
    if target == Path(os.path.realpath(root)):
        raise BadRequest(f"path: {body.path!r} is the checkpoint root itself; name a directory inside it")
    if target.exists() and not (target.is_dir() and is_checkpoint(target)):
        raise Conflict(f"path: {str(target)!r} exists and is not a MARFT checkpoint; it is left as it is")
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
            tensors, meta = _optimizer_files(a.optimizer.state_dict())
            save_file(tensors, d / "optimizer.safetensors")
            (d / "optimizer.json").write_text(json.dumps(meta))
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
        tensors, plain = _rng_files()
        save_file(tensors, tmp / "rng.safetensors")
        (tmp / "rng.json").write_text(json.dumps(plain))
        manifest = {"format": FORMAT, "adapters": adapters, "bases": bases}
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


class _Loaded:
    """Everything a load applies, read and checked before anything changes."""

    def __init__(self, root: Path, manifest: _Manifest, names: list[str]) -> None:
        self.peft: dict[str, dict[str, torch.Tensor]] = {}
        self.heads: dict[str, dict[str, torch.Tensor]] = {}
        self.optim: dict[str, dict[str, Any]] = {}
        for n in names:
            d = root / "adapters" / n
            _, self.peft[n] = read_peft_dir(str(d), "path")
            if manifest.adapters[n].kind == "critic":
                self.heads[n] = load_file(d / "value_head.safetensors")
            if manifest.format == 1:
                self.optim[n] = _legacy_load(d / "optimizer.pt")
            else:
                meta = json.loads((d / "optimizer.json").read_text())
                self.optim[n] = _optimizer_state(load_file(d / "optimizer.safetensors"), meta)
        if manifest.format == 1:
            rng = _legacy_load(root / "rng.pt")
            name, keys, pos, has_gauss, cached = rng["numpy"]
            version, words, gauss = rng["python"]
            self.rng_tensors = {"torch": rng["torch"]} | {
                f"cuda.{i}": s for i, s in enumerate(rng.get("cuda", []))
            }
            self.rng_plain: dict[str, Any] = {
                "python": [version, list(words), gauss],
                "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
            }
        else:
            self.rng_tensors = load_file(root / "rng.safetensors")
            self.rng_plain = json.loads((root / "rng.json").read_text())


# What reading a damaged or crafted checkpoint can raise: each is the request's fault (a 400).
_UNREADABLE = (
    OSError,
    ValueError,
    KeyError,
    TypeError,
    IndexError,
    RuntimeError,
    SafetensorError,
    pickle.UnpicklingError,
)


def load(registry: Registry, root: Path, body: CheckpointRequest) -> CheckpointResponse:
    """Load adapters into their (already created) bases, creating the adapters that do not exist."""
    path = confine(root, body.path)
    mf = path / "manifest.json"
    if not mf.is_file():
        raise BadRequest(f"path: {body.path!r} is not a checkpoint (no manifest.json)")
    try:
        manifest = _Manifest.model_validate_json(mf.read_bytes())
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise BadRequest(f"path: {str(mf)!r} is not a valid manifest: {where}: {err['msg']}") from e
    for n in manifest.adapters:
        if not NAME_RE.match(n):
            raise BadRequest(f"path: {str(mf)!r} names an adapter {n!r}, which is not a valid name")
    names = body.adapters if body.adapters is not None else list(manifest.adapters)
    for i, n in enumerate(names):
        if n not in manifest.adapters:
            raise BadRequest(f"adapters[{i}]: {n!r} is not in the checkpoint")
        b = manifest.adapters[n].base
        if b not in registry.bases:
            src = manifest.bases[b].source if b in manifest.bases else "not recorded"
            raise BadRequest(f"adapters[{i}]: its base {b!r} ({src}) is not loaded; create it first")
        a = registry.adapters.get(n)
        m = manifest.adapters[n]
        if a is not None and (a.kind != m.kind or a.base.name != m.base):
            raise BadRequest(
                f"adapters[{i}]: {n!r} exists here as a {a.kind} on {a.base.name}; the checkpoint has a {m.kind} on {m.base}"
            )
    try:
        loaded = _Loaded(path, manifest, names)
    except _UNREADABLE as e:
        raise BadRequest(f"path: {str(path)!r}: cannot read the checkpoint: {type(e).__name__}: {e}") from e
    try:
        _apply(registry, manifest, names, loaded)
    except _UNREADABLE as e:
        raise BadRequest(
            f"path: {str(path)!r} does not fit the adapters it names ({type(e).__name__}: {e}); "
            "they may be partly loaded: load a checkpoint that fits"
        ) from e
    return CheckpointResponse(path=str(path), adapters=names)


def _apply(registry: Registry, manifest: _Manifest, names: list[str], loaded: _Loaded) -> None:
    device = registry.device
    for n in names:
        m = manifest.adapters[n]
        a = registry.adapters.get(n)
        if a is None:
            a = registry.create_adapter(
                AdapterCreate(
                    name=n,
                    base=m.base,
                    kind=m.kind,
                    lora=m.lora,
                    optimizer=m.optimizer,
                    value_head_hidden=m.value_head_hidden,
                    seed=m.seed,
                )
            )
        assert a.base.peft is not None
        result = peft.set_peft_model_state_dict(a.base.peft, loaded.peft[n], adapter_name=n)
        missing = [k for k in result.missing_keys if f".{n}." in k and "lora_" in k]
        if missing:
            raise KeyError(f"adapters/{n} lacks weights such as {missing[0]}")
        if a.value_head is not None:
            a.value_head.load_state_dict({k: v.to(device) for k, v in loaded.heads[n].items()})
        for p in a.params:
            p.grad = None
        # load_state_dict moves each state tensor to its parameter's device
        state = loaded.optim[n]
        a.optimizer.load_state_dict(state)
        a.version = m.version
        a.lr = m.lr
    lora_batch.bump()
    _set_rng(loaded.rng_tensors, loaded.rng_plain)
