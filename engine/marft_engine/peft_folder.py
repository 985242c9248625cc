"""An adapter on disk as the standard PEFT folder: adapter_config.json + adapter_model.safetensors,
which plain transformers + peft load (PeftModel.from_pretrained). Checkpoints hold one per adapter,
and AdapterCreate.init_from reads one."""

from __future__ import annotations

import json
from pathlib import Path

import peft
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import BadRequest
from .schemas import LoraConfig


def write_peft_dir(model: peft.PeftModel, name: str, base_source: str, d: Path) -> None:
    """Adapter `name` of `model` into folder d (keys without the adapter name, as
    PeftModel.from_pretrained expects)."""
    d.mkdir(parents=True, exist_ok=True)
    state = peft.get_peft_model_state_dict(model, adapter_name=name)
    save_file(
        {k: v.detach().float().contiguous().cpu() for k, v in state.items()}, d / "adapter_model.safetensors"
    )
    config = model.peft_config[name]
    config.base_model_name_or_path = base_source
    config.save_pretrained(str(d))


def read_peft_dir(path: str, field: str = "init_from") -> tuple[LoraConfig, dict[str, torch.Tensor]]:
    """(LoRA config, state dict as peft.set_peft_model_state_dict takes it) of a PEFT folder; errors
    name `field` (the request field the folder came from)."""
    d = Path(path)
    cfg_file = d / "adapter_config.json"
    weights = d / "adapter_model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise BadRequest(
            f"{field}: {path!r} is not a PEFT folder (adapter_config.json + adapter_model.safetensors)"
        )
    try:
        cfg = json.loads(cfg_file.read_text())
        if not isinstance(cfg, dict):
            raise ValueError("adapter_config.json is not a JSON object")
        if cfg.get("peft_type", "LORA") != "LORA":
            raise BadRequest(f"{field}: {path!r} holds a {cfg.get('peft_type')} adapter, not LoRA")
        targets = cfg.get("target_modules") or ["q_proj", "v_proj"]
        if isinstance(targets, str):
            raise BadRequest(f"{field}: {path!r} uses a regex target_modules, which is not supported")
        lora = LoraConfig(
            r=int(cfg.get("r", 8)),
            alpha=float(cfg.get("lora_alpha", 16)),
            dropout=float(cfg.get("lora_dropout", 0.0)),
            target_modules=sorted(targets),
            layers=[layers] if isinstance(layers := cfg.get("layers_to_transform"), int) else layers,
        )
        return lora, load_file(str(weights))
    except (
        OSError,
        ValueError,
        TypeError,
        SafetensorError,
    ) as e:  # pydantic's ValidationError is a ValueError
        raise BadRequest(f"{field}: {path!r} is not a readable PEFT folder: {type(e).__name__}: {e}") from e
