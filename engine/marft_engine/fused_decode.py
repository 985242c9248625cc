"""A CPU decode step of a Llama-shaped fp32 base with one C++ call a layer (csrc/decode_layer.cpp).

Why: at a decode step's few rows, Hugging Face's layer forward dispatches about 280 small tensor
operations a layer (norms, rotary embedding, the KV cache's update, LoRA slots, views) from Python, and
they cost about as long as the layer's products (docs/MEASUREMENTS.md). The kernel runs the same
steps on the panel kernel's products (precision.py), each row through its own adapter's LoRA as
lora_batch.py's per-row path does, and writes the step's keys and values into the sampler's slot
cache (kv_cache.py). The embedding, the rotary tables, the final norm and the head stay in PyTorch.

It applies to the sampler's decode steps of one token a row (no drafts) on a CPU base that computes
in fp32 with its weights in panels (`precision.panels_apply`), of at most PANEL_MAX_ROWS rows, where
the model is a Llama or Qwen2 (full attention, SiLU MLP, no q/k norms, plain embedding and head) and
every LoRA layer is a plain LoRA Linear without dropout. Elsewhere, or with MARFT_FUSED_DECODE=0 (or
MARFT_DECODE_KERNEL=0, which asks for SDPA's attention), the step runs through Hugging Face's
forward: the same tokens and log-probs within fp32 rounding (tests/test_fused_decode.py).
"""

from __future__ import annotations

import os

import torch
from peft.tuners.lora import layer as lora_layer
from transformers import PreTrainedModel

from . import decode_attention, kernels, lora_batch, precision
from .kv_cache import SlotLayer

ENABLED = os.environ.get("MARFT_FUSED_DECODE", "1") != "0"  # the bench's A/B flips it in-process

MODEL_TYPES = ("llama", "qwen2")  # decoder layers of exactly this shape (`_shape_fits`)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_EMPTY = torch.empty(0)


def logits(
    model: PreTrainedModel, kw: dict[str, object], adapter_names: list[str], index: torch.Tensor | None
) -> torch.Tensor | None:
    """The next-token logits [B, V] of a sampler decode step (its `_model_call` arguments kw), each row
    through its adapter in adapter_names; None where the fused step does not apply (module docstring),
    and then nothing has been written."""
    ids, cache, mask, pos = (
        kw.get(k) for k in ("input_ids", "past_key_values", "attention_mask", "position_ids")
    )
    if not (
        ENABLED
        and decode_attention.ENABLED  # MARFT_DECODE_KERNEL=0: SDPA, through the model's forward
        and index is None
        and isinstance(ids, torch.Tensor)
        and isinstance(mask, torch.Tensor)
        and isinstance(pos, torch.Tensor)
        and ids.device.type == "cpu"
        and ids.dim() == 2
        and ids.shape[1] == 1
        and 0 < ids.shape[0] <= precision.PANEL_MAX_ROWS
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and _shape_fits(model)
        # not cached with the shape: an adapter may put a LoRA layer on the head or the embedding
        and type(model.lm_head) is torch.nn.Linear
        and type(model.model.embed_tokens) is torch.nn.Embedding
    ):
        return None
    slots = getattr(cache, "layers", None)
    B = ids.shape[0]
    if not (
        isinstance(slots, list)
        and len(slots) == model.config.num_hidden_layers
        and all(isinstance(s, SlotLayer) and s.n == B and s.kbuf.dtype == torch.float32 for s in slots)
        and mask.shape == (B, slots[0].end + 1 - slots[0].start)
    ):
        return None
    layers = _layers(model, adapter_names)
    if layers is None:
        return None
    inner = model.model
    h = inner.embed_tokens(ids)  # [B, 1, d]
    cos, sin = inner.rotary_emb(h, pos)  # [B, 1, D] each
    cos, sin = cos[:, 0].float().contiguous(), sin[:, 0].float().contiguous()  # [B, D]
    keep = mask.bool().contiguous()  # [B, L + 1]: the columns each row attends, the new one included
    x = h[:, 0].float().contiguous()  # [B, d]
    for layer, s in zip(layers, slots, strict=True):
        x = layer.forward(x, cos, sin, s.kbuf, s.vbuf, s.start, s.end, keep)
        s.view(s.n, s.start, s.end + 1)  # as SlotLayer.update leaves it
    return model.lm_head(inner.norm(x)).float()  # [B, V]


def _shape_fits(model: PreTrainedModel) -> bool:
    """Whether every decoder layer of the model is the kernel's (cached on the model: the base's
    structure does not change, only its adapters)."""
    fits = getattr(model, "_marft_fused_fits", None)
    if fits is None:
        fits = _check_shape(model)
        model._marft_fused_fits = fits  # type: ignore[assignment]
    return fits


def _check_shape(model: PreTrainedModel) -> bool:
    c = model.config
    if (
        c.model_type not in MODEL_TYPES
        or getattr(c, "hidden_act", None) != "silu"
        or any(t != "full_attention" for t in (getattr(c, "layer_types", None) or []))
        or getattr(c, "use_sliding_window", False)
        or not precision.panels_apply()
        or kernels.load() is None
        or not isinstance(getattr(_plain(model.lm_head), "_marft_packed", None), precision.Panels)
    ):
        return False
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if {n for n, _ in attn.named_children()} - {"q_proj", "k_proj", "v_proj", "o_proj"}:
            return False  # q/k norms (Qwen3) or anything else the kernel does not do
        for m in _modules(layer):
            if not isinstance(getattr(_plain(m), "_marft_packed", None), precision.Panels):
                return False
        if type(mlp.act_fn).__name__ != "SiLUActivation" and not isinstance(mlp.act_fn, torch.nn.SiLU):
            return False
    return True


def _plain(m: torch.nn.Module) -> torch.nn.Module:
    """The frozen layer under a LoRA layer, or the layer itself."""
    return m.get_base_layer() if isinstance(m, lora_layer.LoraLayer) else m


def _modules(layer: torch.nn.Module) -> list[torch.nn.Module]:
    attn, mlp = layer.self_attn, layer.mlp
    return [
        getattr(attn if n.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else mlp, n) for n in PROJECTIONS
    ]


def _layers(model: PreTrainedModel, adapter_names: list[str]) -> list[object] | None:
    """The kernel's layers for these rows' adapters, built once per set of rows and adapter weights
    (kept on the model for the next steps of the same rows); None where a LoRA layer is not plain."""
    key = (tuple(adapter_names), lora_batch.epoch())
    cached = getattr(model, "_marft_fused_layers", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    k = kernels.load()
    assert k is not None
    names = tuple(sorted(set(adapter_names)))
    row_slots: dict[tuple[tuple[str, int], ...], torch.Tensor] = {}  # per slot layout: each row's slot
    layers = []
    for layer in model.model.layers:
        projs = []
        for m in _modules(layer):
            p = _proj(k, m, names, adapter_names, row_slots)
            if p is None:
                return None
            projs.append(p)
        attn = layer.self_attn
        ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
        layers.append(
            k.DecodeLayer(
                ln1.weight.float(),
                ln2.weight.float(),
                float(ln1.variance_epsilon),
                projs,
                attn.head_dim,
                attn.scaling,
            )
        )
    model._marft_fused_layers = (key, layers)  # type: ignore[assignment]
    return layers


def _proj(
    k: object,
    m: torch.nn.Module,
    names: tuple[str, ...],
    adapter_names: list[str],
    row_slots: dict[tuple[tuple[str, int], ...], torch.Tensor],
) -> object | None:
    """A projection for the kernel: its base panels and bias, and the rows' LoRA (lora_batch._stacks)."""
    lora = isinstance(m, lora_layer.Linear)
    base = _plain(m)
    panels: precision.Panels = base._marft_packed
    bias = _EMPTY if base.bias is None else base.bias.detach().float().contiguous()
    K, N = base.in_features, base.out_features
    if not lora or m.disable_adapters or not any(a in m.lora_A for a in names):
        if lora and m.merged:
            return None
        return k.Proj(panels.data, K, N, bias, _EMPTY, 0, _EMPTY, 0, _EMPTY)  # type: ignore[attr-defined]
    if (
        m.merged
        or m.training
        or any(a in m.lora_variant for a in names)
        or any(not isinstance(m.lora_dropout[a], torch.nn.Identity) for a in names if a in m.lora_dropout)
    ):
        return None
    A, _, slot, A_packed, B_packed = lora_batch._stacks(m, names, torch.float32)
    if not isinstance(A_packed, precision.Panels) or not isinstance(B_packed, precision.Panels):
        return None
    key = tuple(slot.items())  # the same for every projection whose LoRA the same adapters have
    if key not in row_slots:
        row_slots[key] = torch.tensor([slot.get(a, -1) for a in adapter_names], dtype=torch.int64)  # [B]
    slots = row_slots[key]
    r = A.shape[0] // len(slot)
    return k.Proj(panels.data, K, N, bias, A_packed.data, A.shape[0], B_packed.data, r, slots)  # type: ignore[attr-defined]
