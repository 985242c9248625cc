"""A CPU decode step of a Llama-shaped base with one C++ call a layer (csrc/decode_layer.cpp).

Why: at a decode step's few rows, Hugging Face's layer forward dispatches about 280 small tensor
operations a layer (norms, rotary embedding, the KV cache's update, LoRA slots, views) from Python, and
they cost about as long as the layer's products (docs/MEASUREMENTS.md). The kernel runs the same
steps on the panel kernel's products (precision.py), each row through its own adapter's LoRA as
lora_batch.py's per-row path does, and writes the step's keys and values into the sampler's slot
cache (kv_cache.py). The embedding, the rotary tables and the final norm stay in PyTorch, and so does
an fp32 base's head (on its panels); a bf16 base's head is one more product on the bf16 panels.

It applies to the sampler's decode steps of one token a row (no drafts) of at most PANEL_MAX_ROWS rows
on a CPU base whose linear weights the kernel has in panels: an fp32 base's in fp32 panels
(`precision.panels_apply`), a bf16 base's in bf16 panels (`precision.bf16_panels_apply`, AVX512_BF16).
The model must be a Llama or Qwen2 (full attention, SiLU MLP, no q/k norms, plain embedding and head)
and every LoRA layer a plain LoRA Linear without dropout. Elsewhere, or with MARFT_FUSED_DECODE=0 (or
MARFT_DECODE_KERNEL=0, which asks for SDPA's attention), the step runs through Hugging Face's forward.
An fp32 base gets the same tokens and log-probs within fp32 rounding (tests/test_fused_decode.py).
A bf16 base's products take bf16 inputs and weights as under autocast, but keep their fp32 sums where
autocast rounds each product's output (the head's logits included) to bf16, and its LoRA products run
in fp32: so its log-probs are closer to an fp32 pass than Hugging Face's bf16 step, and differ from
it within bf16 rounding.

The sampler's prefill passes on such a base run the same layers (`prefill`): a rollout's prefills are
mostly one or a few prompts, where the model's forward spends as long dispatching its operations and
small LoRA products as on its products. MARFT_FUSED_PREFILL=0 turns that alone off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from peft.tuners.lora import layer as lora_layer
from transformers import PreTrainedModel

from . import decode_attention, kernels, lora_batch, precision
from .kv_cache import SlotLayer

ENABLED = os.environ.get("MARFT_FUSED_DECODE", "1") != "0"  # the bench's A/B flips it in-process
# the sampler's prefill passes the same way (`prefill`), up to PREFILL_MAX_TOKENS new tokens a pass
PREFILL_ENABLED = os.environ.get("MARFT_FUSED_PREFILL", "1") != "0"
PREFILL_MAX_TOKENS = 4096

MODEL_TYPES = ("llama", "qwen2")  # decoder layers of exactly this shape (`_check_shape`)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_EMPTY = torch.empty(0)
_NO_ROWS = torch.empty(0, dtype=torch.int64)  # a projection's LoRA slots before `_layers` sets its rows'
CACHE_DTYPES = (torch.float32, torch.bfloat16)  # the slot caches it writes and attends (precision.place)


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
        and (kind := _pass_kind(model)) is not None
    ):
        return None
    slots = getattr(cache, "layers", None)
    B = ids.shape[0]
    if not (
        isinstance(slots, list)
        and len(slots) == model.config.num_hidden_layers
        and all(isinstance(s, SlotLayer) and s.n == B and s.kbuf.dtype in CACHE_DTYPES for s in slots)
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
    return _head(model, kind, inner.norm(x))


def prefill(
    model: PreTrainedModel,
    adapters: list[str],
    ids: list[list[int]],
    starts: list[int],
    past: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]] | None:
    """A sampler prefill pass of P prompts with one C++ call a layer: prompt i runs ids[i] (its tokens
    after the first starts[i], which its cached prefix holds) through adapters[i]. past: the cached
    prefixes' keys and values [layers, P, Hk, C, D] each, prompt i's right-aligned in its C columns
    (None: no prompt has one). Returns the last token's logits [P, V] and each layer's keys and values
    [P, Hk, C + S, D] (S: the most new tokens of a prompt), prompt i's new ones right-aligned, as the
    sampler's padded pass leaves them; None where the fused pass does not apply (as for `logits`, and
    at more than PREFILL_MAX_TOKENS new tokens, where the products run at full rate anyway)."""
    lens = [len(t) for t in ids]
    N, P = sum(lens), len(ids)
    if not (
        ENABLED
        and PREFILL_ENABLED
        and 0 < N <= PREFILL_MAX_TOKENS
        and model.device.type == "cpu"
        and (kind := _pass_kind(model)) is not None
    ):
        return None
    layers = _layers(model, [a for a, n in zip(adapters, lens, strict=True) for _ in range(n)], "prefill")
    if layers is None:
        return None
    inner = model.model
    C = 0 if past is None else past[0].shape[3]
    S = max(lens)
    L = C + S
    shape = (len(layers), P, model.config.num_key_value_heads, L, inner.layers[0].self_attn.head_dim)
    kbuf = torch.zeros(shape, dtype=torch.bfloat16 if kind == "bf16" else torch.float32)
    vbuf = torch.zeros_like(kbuf)
    if past is not None:
        kbuf[..., :C, :], vbuf[..., :C, :] = past
    n = torch.tensor(lens)
    row = torch.repeat_interleave(torch.arange(P), n)  # [N]: each token's prompt
    col = torch.cat([torch.arange(L - m, L) for m in lens])  # [N]: its column in the cache
    pos = torch.cat([torch.arange(c, c + m) for c, m in zip(starts, lens, strict=True)])  # [N]
    # keep [P, 1, S, L]: a prompt's query at t (real from S - s on) attends its cached prefix's columns
    # and its own new ones up to its own; a padding query only its own column (its output is unused)
    t = torch.arange(S).view(1, S, 1)
    j = torch.arange(L).view(1, 1, L)
    c, s = torch.tensor(starts).view(P, 1, 1), n.view(P, 1, 1)
    real = t >= S - s
    keep = (real & (((j >= C - c) & (j < C)) | ((j >= L - s) & (j <= C + t)))) | (~real & (j == C + t))
    keep = keep.view(P, 1, S, L).contiguous()
    h = inner.embed_tokens(torch.tensor([i for ts in ids for i in ts]).view(1, N))  # [1, N, d]
    cos, sin = inner.rotary_emb(h, pos.view(1, N))  # [1, N, D] each
    cos, sin = cos[0].float().contiguous(), sin[0].float().contiguous()
    x = h[0].float().contiguous()  # [N, d]
    for layer, kb, vb in zip(layers, kbuf, vbuf, strict=True):
        x = layer.prefill(x, cos, sin, kb, vb, row, col, keep)
    last = torch.cumsum(n, 0) - 1  # [P]: each prompt's last token
    return _head(model, kind, inner.norm(x[last])), list(zip(kbuf, vbuf, strict=True))


def _head(model: PreTrainedModel, kind: str, h: torch.Tensor) -> torch.Tensor:
    """The logits [B, V] of final-norm outputs h [B, d]."""
    if kind == "fp32":
        return model.lm_head(h).float()  # [B, V], on the head's panels
    head = model.lm_head
    k = kernels.load()
    assert k is not None
    y = k.panel_linear_bf16(h, head._marft_bf16_panels, head.out_features)  # [B, V]
    return y if head.bias is None else y + head.bias.float()


def _pass_kind(model: PreTrainedModel) -> str | None:
    """`_kind`, where this pass is one the kernel's layers take (no gradients, the base's autocast,
    a plain head and embedding); else None."""
    kind = _kind(model)
    if (
        kind is None
        or torch.is_grad_enabled()
        # a bf16 base's passes run under bf16 autocast (precision.autocast), an fp32 one's without
        or torch.is_autocast_enabled("cpu") != (kind == "bf16")
        # not cached with the shape: an adapter may put a LoRA layer on the head or the embedding
        or type(model.lm_head) is not torch.nn.Linear
        or type(model.model.embed_tokens) is not torch.nn.Embedding
    ):
        return None
    return kind


def _kind(model: PreTrainedModel) -> str | None:
    """'fp32' or 'bf16' where every decoder layer of the model and its head are the kernel's, with
    their weights in its panels of that kind; else None (cached on the model: the base's structure
    and weights do not change, only its adapters)."""
    if not hasattr(model, "_marft_fused_kind"):
        model._marft_fused_kind = _check_shape(model)  # type: ignore[assignment]
    return model._marft_fused_kind  # type: ignore[no-any-return]


def _check_shape(model: PreTrainedModel) -> str | None:
    c = model.config
    head = _plain(model.lm_head)
    kind = "bf16" if isinstance(head, torch.nn.Linear) and head.weight.dtype == torch.bfloat16 else "fp32"
    if (
        c.model_type not in MODEL_TYPES
        or getattr(c, "hidden_act", None) != "silu"
        or any(t != "full_attention" for t in (getattr(c, "layer_types", None) or []))
        or getattr(c, "use_sliding_window", False)
        or kernels.load() is None
        or _panels(head, kind) is None
    ):
        return None
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if {n for n, _ in attn.named_children()} - {"q_proj", "k_proj", "v_proj", "o_proj"}:
            return None  # q/k norms (Qwen3) or anything else the kernel does not do
        if any(_panels(_plain(m), kind) is None for m in _modules(layer)):
            return None
        if type(mlp.act_fn).__name__ != "SiLUActivation" and not isinstance(mlp.act_fn, torch.nn.SiLU):
            return None
    return kind


def _panels(base: torch.nn.Module, kind: str) -> torch.Tensor | None:
    """A frozen linear layer's weight in the kernel's panels of `kind` (precision.py), or None."""
    if kind == "bf16":
        panels = getattr(base, "_marft_bf16_panels", None)
        return panels if isinstance(panels, torch.Tensor) else None
    packed = getattr(base, "_marft_packed", None)
    return packed.data if isinstance(packed, precision.Panels) else None


def _plain(m: torch.nn.Module) -> torch.nn.Module:
    """The frozen layer under a LoRA layer, or the layer itself."""
    return m.get_base_layer() if isinstance(m, lora_layer.LoraLayer) else m


def _modules(layer: torch.nn.Module) -> list[torch.nn.Module]:
    attn, mlp = layer.self_attn, layer.mlp
    return [
        getattr(attn if n.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else mlp, n) for n in PROJECTIONS
    ]


@dataclass
class _Built:
    """The kernel's layers for one set of adapters at one set of adapter weights."""

    key: tuple[tuple[str, ...], int]
    layers: list[object] | None  # None: a LoRA layer the kernel does not take
    slot_maps: list[list[dict[str, int] | None]]  # per layer and projection: its LoRA slot of each adapter
    rows: tuple[str, ...] | None = None  # the adapters of the rows whose slots the layers hold


def _layers(model: PreTrainedModel, adapter_names: list[str], use: str = "decode") -> list[object] | None:
    """The kernel's layers for rows of these adapters: built once per set of adapters and adapter
    weights and kept on the model, one set per use (a prefill between two decode steps does not evict
    the decode's); rows that join or leave only set each projection's LoRA slot of each row. None
    where a LoRA layer is not plain."""
    names = tuple(sorted(set(adapter_names)))
    key = (names, lora_batch.epoch())
    attr = f"_marft_fused_{use}_layers"
    built = getattr(model, attr, None)
    if not isinstance(built, _Built) or built.key != key:
        built = _build(model, names, key)
        setattr(model, attr, built)
    if built.layers is None:
        return None
    rows = tuple(adapter_names)
    if built.rows != rows:
        slots: dict[tuple[tuple[str, int], ...], torch.Tensor] = {}  # per slot map: each row's slot [B]
        for layer, maps in zip(built.layers, built.slot_maps, strict=True):
            per_proj = []
            for slot in maps:
                if slot is None:
                    per_proj.append(_EMPTY)
                    continue
                k = tuple(slot.items())  # the same for every projection whose LoRA the same adapters have
                if k not in slots:
                    slots[k] = torch.tensor([slot.get(a, -1) for a in adapter_names], dtype=torch.int64)
                per_proj.append(slots[k])
            layer.set_slots(per_proj)  # type: ignore[attr-defined]
        built.rows = rows
    return built.layers


def _build(model: PreTrainedModel, names: tuple[str, ...], key: tuple[tuple[str, ...], int]) -> _Built:
    k = kernels.load()
    assert k is not None
    layers, slot_maps = [], []
    for layer in model.model.layers:
        projs, maps = [], []
        for m in _modules(layer):
            p = _proj(k, m, names)
            if p is None:
                return _Built(key, None, [])
            projs.append(p[0])
            maps.append(p[1])
        attn = layer.self_attn
        ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
        layers.append(
            k.DecodeLayer(  # type: ignore[attr-defined]
                ln1.weight.float(),
                ln2.weight.float(),
                float(ln1.variance_epsilon),
                projs,
                attn.head_dim,
                attn.scaling,
            )
        )
        slot_maps.append(maps)
    return _Built(key, layers, slot_maps)


def _proj(
    k: object, m: torch.nn.Module, names: tuple[str, ...]
) -> tuple[object, dict[str, int] | None] | None:
    """A projection for the kernel: its base panels and bias, and the adapters' LoRA stacks
    (lora_batch._stacks) with each adapter's slot in them (None: no LoRA); its rows' slots are set per
    call (`_layers`)."""
    lora = isinstance(m, lora_layer.Linear)
    base = _plain(m)
    panels = _panels(base, "bf16" if base.weight.dtype == torch.bfloat16 else "fp32")
    assert panels is not None  # _check_shape saw to it
    bias = _EMPTY if base.bias is None else base.bias.detach().float().contiguous()
    K, N = base.in_features, base.out_features
    if not lora or m.disable_adapters or not any(a in m.lora_A for a in names):
        if lora and m.merged:
            return None
        return k.Proj(panels, K, N, bias, _EMPTY, 0, _EMPTY, 0, _NO_ROWS), None  # type: ignore[attr-defined]
    if (
        m.merged
        or m.training
        or any(a in m.lora_variant for a in names)
        or any(not isinstance(m.lora_dropout[a], torch.nn.Identity) for a in names if a in m.lora_dropout)
    ):
        return None
    A, B, slot, A_packed, B_packed = lora_batch._stacks(m, names, torch.float32)
    if isinstance(A_packed, precision.Panels) and isinstance(B_packed, precision.Panels):
        A_panels, B_panels = A_packed.data, B_packed.data
    else:  # a bf16 base: its fp32 LoRA stacks are not packed for its other passes
        A_panels, B_panels = _lora_panels(k, m, A, B)
    r = A.shape[0] // len(slot)
    proj = k.Proj(panels, K, N, bias, A_panels, A.shape[0], B_panels, r, _NO_ROWS)  # type: ignore[attr-defined]
    return proj, slot


def _lora_panels(
    k: object, m: torch.nn.Module, A: torch.Tensor, B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 panels of a LoRA layer's stacks A [n r, d_in] and B [d_out, n r] (lora_batch._stacks),
    kept on the layer while those stacks are the same tensors."""
    cached = getattr(m, "_marft_fused_lora", None)
    if cached is not None and cached[0] is A and cached[1] is B:
        return cached[2]
    panels = (k.pack_panels(A), k.pack_panels(B))  # type: ignore[attr-defined]
    m._marft_fused_lora = (A, B, panels)  # type: ignore[assignment]
    return panels
