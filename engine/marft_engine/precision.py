"""Precision: which dtype a base computes in, how its weights are stored, and decode attention.

A base computes in fp32 or bf16 (`compute_dtype`). On a GPU a bf16 base is stored in bf16. On a CPU
it keeps fp32 embeddings and norms (so the residual stream is fp32, as under autocast) and bf16
linear weights (`bf16_linear_weights`), every pass runs under bf16 autocast (`autocast`), and the
sampler decodes from a bf16 KV cache (fp32 without the engine's attention kernel) with attention in
fp32 (`install_decode_attention`, `place`). On a CPU,
passes without gradients (sampling, forward) multiply by prepacked copies of the linear weights
(`pack_linear_weights`): in fp32, every one in the panels of the engine's own kernel on a CPU with AVX2
but no AVX512 (`Panels`), else the large ones by oneDNN; in bf16, by oneDNN where the CPU has native
bf16, and also in the kernel's bf16 panels for the fused decode step where it has AVX512_BF16
(`bf16_panels_apply`).
LoRA weights, value heads and optimizer state are fp32 everywhere (see registry.py).
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import decode_attention, kernels, unpad
from .kernels import cpu_flags

DECODE_ATTENTION = "marft_sdpa"  # the name the attention override is registered under


# CPU feature flags (as /proc/cpuinfo spells them) of native bf16 matmul instructions. Without them a
# bf16 matmul is emulated and much slower than fp32 (docs/MEASUREMENTS.md: 45x on a Zen 3 core).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def compute_dtype(
    requested: str, device: torch.device, flags: frozenset[str] | None = None
) -> tuple[torch.dtype, str]:
    """BaseCreate.dtype -> (the dtype a base computes in, why). `auto` is bf16 on a GPU, and on a CPU
    only where the CPU has native bf16 instructions (`flags`: default, this CPU's); elsewhere fp32,
    which is also what keeps sample/forward parity exact."""
    if requested == "bfloat16":
        return torch.bfloat16, "requested"
    if requested == "float32":
        return torch.float32, "requested"
    if device.type == "cuda":
        return torch.bfloat16, "auto: CUDA device"
    native = sorted(set(NATIVE_BF16_FLAGS) & (cpu_flags() if flags is None else flags))
    if native:
        return torch.bfloat16, f"auto: the CPU has native bf16 ({', '.join(native)})"
    return torch.float32, f"auto: the CPU has no native bf16 ({' or '.join(NATIVE_BF16_FLAGS)})"


def place(model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> torch.dtype | None:
    """Move a frozen base to the device in the storage its compute dtype wants (module docstring).
    Returns the dtype of the sampler's KV cache: None for the one the model computes in."""
    store_parameters(model, device, dtype if device.type == "cuda" else torch.float32)
    model.eval().requires_grad_(False)
    if device.type != "cpu":
        return None
    install_decode_attention(model)
    kernels.load()  # built (once, tens of seconds) or loaded here, not in the first decode step
    if dtype == torch.bfloat16:
        bf16_linear_weights(model)
    pack_linear_weights(model)
    if dtype != torch.bfloat16:
        return None
    # A bf16 base's decode steps read bf16 keys and values (half the bytes; the steps are bound by
    # reading them) where the engine's attention kernel reads them. CPU SDPA in bf16 is several times
    # slower for a one-token query, so without the kernel the cache stays fp32.
    return torch.bfloat16 if decode_attention.ENABLED and kernels.load() is not None else torch.float32


def store_parameters(model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> None:
    """Move the model to the device with its parameters in dtype and its buffers as they are:
    `model.to(dtype=...)` would also round the rotary embedding's fp32 inverse frequencies (a
    buffer) to bf16, an angle error that grows with the position."""
    model.to(device=device)
    for p in model.parameters():  # tied weights are one parameter: cast once, still tied
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)


def bf16_linear_weights(model: PreTrainedModel) -> None:
    """Store a frozen model's linear weights in bf16, everything else as it is. Under bf16 autocast a
    linear layer casts its weight to bf16 anyway, so the results are unchanged; what goes is that cast,
    on every call (frozen weights are not in autocast's cast cache), a large share of a CPU decode
    step. A tied LM head gets its own bf16 copy, so the input embeddings stay fp32."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and head.weight is emb.weight:
        head.weight = torch.nn.Parameter(emb.weight.detach().to(torch.bfloat16), requires_grad=False)
        model.config.tie_word_embeddings = False
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight.data = m.weight.data.to(torch.bfloat16)
            if m.bias is not None:
                m.bias.data = m.bias.data.to(torch.bfloat16)


# The row count oneDNN is told to expect when it packs a weight: a decode batch's. Every row count
# runs on the packed weight; this one only picks its layout (one packed for 32 rows ran as fast as one
# packed for the row count at hand from 1 to 1,024 rows, docs/MEASUREMENTS.md).
PACK_ROWS = 32

# fp32 weights are packed only from this many elements, and their packed product runs only on up to
# FP32_PACKED_MAX_ROWS rows. Why, on an Intel core (docs/MEASUREMENTS.md): oneDNN's fp32 inner product
# has a higher fixed cost a call than MKL's sgemm, more than the re-layout it saves on a small weight
# (attention projections of a 135M model, LoRA stacks); and on a thousand rows MKL's own kernel is
# as fast or faster, so forward passes over many tokens keep it.
FP32_PACK_MIN_ELEMENTS = 2**19
FP32_PACKED_MAX_ROWS = 256

# fp32 products of at most PANEL_MAX_ROWS rows run on `Panels` on a CPU with AVX2 and FMA but no
# AVX512. Why, on a Zen 3 core (docs/MEASUREMENTS.md): at a decode step's 1 to 64 rows MKL's and
# oneDNN's products ran at under half of the multiply-add rate the kernel reaches; from a few hundred
# rows MKL's blocked kernel is as fast or faster. oneDNN's AVX512 kernels were not measured against it.
PANEL_MAX_ROWS = 128


class Panels(NamedTuple):
    """An fp32 weight [n, K] laid out for the engine's panel kernel (csrc/panel_linear.cpp)."""

    data: torch.Tensor  # [ceil(n / 16), K, 16]
    n: int  # output columns

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32


Packed = torch.Tensor | Panels  # a weight as `pack_weight` gives it


@functools.cache
def panels_apply() -> bool:
    """Whether fp32 weights go into `Panels` here (PANEL_MAX_ROWS)."""
    k = kernels.load()
    return k is not None and k.panels_available() and "avx512f" not in cpu_flags()


@functools.cache
def bf16_panels_apply() -> bool:
    """Whether a bf16 CPU base also keeps its linear weights in the kernel's bf16 panels, which the
    fused decode step (fused_decode.py) multiplies by: where the kernel was built with AVX512_BF16 and
    the CPU has no AMX (oneDNN's AMX kernels were not measured against it)."""
    k = kernels.load()
    return k is not None and k.panels_bf16_available() and "amx_bf16" not in cpu_flags()


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU has native bf16 matmul instructions and PyTorch has oneDNN to run them."""
    return bool(set(NATIVE_BF16_FLAGS) & cpu_flags()) and torch.backends.mkldnn.is_available()


def pack_weight(w: torch.Tensor, bias: torch.Tensor | None = None) -> Packed | None:
    """A CPU weight [d_out, d_in] prepacked for `packed_linear`, or None. Why: the plain product
    re-lays the weight out on every call (MKL's sgemm packs an fp32 one into panels; oneDNN re-lays a
    bf16 one for AMX tiles or AVX512_BF16 pairs), a copy of the weight each time, which at a decode
    step's few rows is a large share of the product (docs/MEASUREMENTS.md).
    - fp32 where `panels_apply`: `Panels`, whatever the size.
    - fp32 elsewhere: oneDNN's packed weight from FP32_PACK_MIN_ELEMENTS, None below.
    - bf16: oneDNN's packed weight where the CPU has native bf16 and the packed product is
      bit-identical to the plain one (the plain one's kernel), else None.
    Neither fp32 product is MKL's, so their results differ from the plain one's in the last bits (tests
    bound them against float64)."""
    if w.device.type != "cpu":
        return None
    fp32 = w.dtype == torch.float32
    if fp32 and panels_apply():
        kernel = kernels.load()
        assert kernel is not None
        return Panels(kernel.pack_panels(w.detach()), w.shape[0])
    if not torch.backends.mkldnn.is_available():
        return None
    if not (w.numel() >= FP32_PACK_MIN_ELEMENTS if fp32 else w.dtype == torch.bfloat16 and native_bf16()):
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)
        if fp32:
            return packed
        x = torch.randn(3, w.shape[1]).to(torch.bfloat16)
        same = torch.equal(packed_linear(x, packed, bias), F.linear(x, w, bias))
    except RuntimeError:  # a oneDNN build without a kernel of this dtype for this CPU: the plain product
        return None
    return packed if same else None


def packed_linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., d_in] (cast to the weight's dtype) times a `pack_weight` weight -> [..., d_out] in
    that dtype."""
    if isinstance(packed, Panels):
        kernel = kernels.load()
        assert kernel is not None
        y = kernel.panel_linear(x.float().reshape(-1, x.shape[-1]), packed.data, packed.n)  # [M, d_out]
        y = y.view(*x.shape[:-1], packed.n)
        return y if bias is None else y + bias
    return torch.ops.mkldnn._linear_pointwise(x.to(packed.dtype), packed, bias, "none", [], "")


def takes_packed(x: torch.Tensor, packed: Packed, runs_in: torch.dtype) -> bool:
    """Whether a product of x [..., d_in] that runs in dtype `runs_in` goes by `packed`: no
    gradients, its dtype, and (fp32) at most PANEL_MAX_ROWS or FP32_PACKED_MAX_ROWS rows."""
    if runs_in != packed.dtype or torch.is_grad_enabled():
        return False
    if packed.dtype != torch.float32:
        return True
    most = PANEL_MAX_ROWS if isinstance(packed, Panels) else FP32_PACKED_MAX_ROWS
    return x.numel() <= most * x.shape[-1]


def linear(x: torch.Tensor, w: torch.Tensor, packed: Packed | None) -> torch.Tensor:
    """x times w.T: by `packed` (w as `pack_weight` gave it) where it takes x, else plain."""
    if packed is not None and takes_packed(x, packed, x.dtype):
        return packed_linear(x, packed, None)
    return F.linear(x, w)


def pack_linear_weights(model: PreTrainedModel) -> int:
    """Give each linear layer of a frozen CPU model whose weight `pack_weight` packs that prepacked
    copy, which passes without gradients multiply by (`_packed_forward`): sampling and forward. Training
    passes keep the plain weight, which their backward needs, so the packed copies cost the memory of
    those weights once more. A bf16 layer also gets its weight in bf16 panels (`_marft_bf16_panels`)
    where `bf16_panels_apply`, for the fused decode step: once more that memory. Returns how many
    layers were packed."""
    n = 0
    for m in model.modules():
        if type(m) is not torch.nn.Linear:
            continue
        if m.weight.dtype == torch.bfloat16 and bf16_panels_apply():
            kernel = kernels.load()
            assert kernel is not None
            m._marft_bf16_panels = kernel.pack_panels_bf16(m.weight.detach())  # type: ignore[assignment]
        if (w := pack_weight(m.weight, m.bias)) is not None:
            m._marft_packed = w  # type: ignore[assignment]  # not a parameter or buffer: never saved
            m.forward = types.MethodType(_packed_forward, m)  # type: ignore[method-assign]
            n += 1
    return n


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A packed layer's forward: the packed product where `takes_packed` (bf16: a bf16 input, or CPU
    autocast to bf16, which would cast the input; fp32: an fp32 input outside autocast, on few rows),
    else the plain one. x [..., d_in] -> [..., d_out]."""
    runs_in = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
    if takes_packed(x, self._marft_packed, runs_in):
        return packed_linear(x, self._marft_packed, self.bias)
    return F.linear(x, self.weight, self.bias)


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[object]:
    """The context a pass of a base computing in `dtype` runs in (a bf16 base's weights may be
    stored fp32, see `place`)."""
    if dtype == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def install_decode_attention(model: PreTrainedModel) -> None:
    """For a base on a CPU: `attention_in_cache_dtype`. Why: for a bf16 base, CPU attention kernels
    are several times slower in bf16 for a one-token query, while the weight matmuls, which dominate
    a decode step, are faster; for every base, masked attention shares the grouped-query heads in
    SDPA instead of copying the keys and values once per query head, as Hugging Face's sdpa path
    does (4.7x faster for a decode step's attention, docs/MEASUREMENTS.md). Registers the override
    with transformers (idempotent) and switches the model to it."""
    AttentionInterface.register(DECODE_ATTENTION, attention_in_cache_dtype)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(DECODE_ATTENTION)


# A bf16 training pass on a CPU computes attention as explicit fp32 products (`explicit_attention`)
# when its score matrix (B x H x T x L) has at most this many elements. Why: SDPA's flash kernel has a
# slow bf16 backward on a CPU at short lengths (27 ms a layer for 8 rows of 90 tokens, a third of
# the whole pass, docs/MEASUREMENTS.md); explicit products keep the score matrix for the backward
# (4 bytes an element, every layer), so longer passes keep the flash kernel.
EXPLICIT_ATTENTION_SCORES = 2**22


def explicit_attention(
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, H_kv, L, D]
    value: torch.Tensor,  # [B, H_kv, L, D]
    attention_mask: torch.Tensor | None,  # [B, 1, T, L] bool, True = attend; None = causal
    scaling: float | None,
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v in fp32, with each key/value head shared by its group of
    query heads (no copy per head). Returns [B, H, T, D] fp32."""
    B, H, T, D = query.shape
    Hk, L = key.shape[1], key.shape[2]
    g = H // Hk  # query heads per key/value head
    with torch.autocast(query.device.type, enabled=False):
        # the scale on q, not on the scores: a product over B H T D elements, not B H T L
        q = query.float() * (D**-0.5 if scaling is None else scaling)
        q = q.reshape(B, Hk, g * T, D)  # heads h*g .. h*g+g-1 read key/value head h
        scores = (q @ key.float().transpose(-1, -2)).view(B, Hk, g, T, L)
        if attention_mask is None:
            keep = torch.ones(T, L, dtype=torch.bool, device=query.device).tril(L - T)  # [T, L]
        else:
            keep = attention_mask[:, :, None]  # [B, 1, 1, T, L]
        # Masked by adding a large negative number, broadcast over the group: no copy of the mask per
        # query head, and the backward of an addition is free (a masked fill's is another fill).
        # Finite, not -inf: a row with no key to attend (a padding query) must not turn into NaN; it
        # gets a uniform softmax, as with the fill, and its gradient is zero downstream.
        bias = torch.where(keep, 0.0, MASKED).float()  # [.., T, L]
        scores = (scores + bias).view(B, Hk, g * T, L)  # [B, Hk, gT, L]
        out = scores.softmax(-1) @ value.float()  # [B, Hk, gT, D]
    return out.reshape(B, H, T, D)


# The score added at masked positions: exp(MASKED - max) is exactly 0 beside any real score, and a
# score plus MASKED stays finite and rounds to MASKED (so a row with no real key is uniform).
MASKED = -1e30


def attention_in_cache_dtype(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """`_attention` (its arguments), and in a pass over real tokens only (unpad.py) with the tokens
    put back into their padded rows around it: query [1, H, N, D] (key and value too, unless a
    prefill's cache padded them), attention_mask ignored for the layout's [B, 1, T, L]. Returns
    ([B, T, H, D], None), or ([1, N, H, D], None) unpadded."""
    lay = unpad.layout()
    if lay is None:
        return _attention(module, query, key, value, attention_mask, **kwargs)  # type: ignore[arg-type]
    if key.shape[0] != lay.B:
        key, value = lay.pad(key), lay.pad(value)
    out, _ = _attention(module, lay.pad(query), key, value, lay.mask, **kwargs)  # type: ignore[arg-type]
    return lay.unpad(out), None


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, H_kv, L, D]
    value: torch.Tensor,  # [B, H_kv, L, D]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """SDPA in the dtype of the values: fp32 when decoding from an fp32 cache under bf16 autocast
    (autocast would otherwise run it in bf16), bf16 in prefill and training passes as autocast does
    (there rotary embeddings may have promoted queries and keys to fp32, values are bf16). With a
    mask (always, in the sampler) grouped-query heads are shared by SDPA instead of copied per step,
    as Hugging Face's sdpa path does for masked attention. A bf16 training pass on a CPU whose
    scores are few takes `explicit_attention` instead (EXPLICIT_ATTENTION_SCORES). Returns
    ([B, T, H, D], None)."""
    B, H, T, _ = query.shape
    # a decode step from a bf16 slot cache that the kernel below does not take: fp32, as from an fp32 one
    reads_cache = query.device.type == "cpu" and T < key.shape[2] and not torch.is_grad_enabled()
    dt = torch.float32 if value.dtype == torch.bfloat16 and reads_cache else value.dtype
    if (
        dt == torch.bfloat16
        and query.device.type == "cpu"
        and torch.is_grad_enabled()
        and dropout == 0.0
        and (attention_mask is None or attention_mask.dtype == torch.bool)
        and B * H * T * key.shape[2] <= EXPLICIT_ATTENTION_SCORES
    ):
        out = explicit_attention(query, key, value, attention_mask, scaling)  # [B, H, T, D] fp32
        return out.transpose(1, 2).contiguous().to(query.dtype), None
    if (
        dropout == 0.0
        and (out := decode_attention.attend(query, key, value, attention_mask, scaling)) is not None
    ):
        return out.to(query.dtype), None  # a CPU decode step: decode_attention.py
    with torch.autocast(query.device.type, enabled=False):
        if attention_mask is None:  # the causal cases: Hugging Face's own handling
            out, _ = sdpa_attention_forward(
                module,  # type: ignore[arg-type]
                query.to(dt),
                key.to(dt),
                value.to(dt),
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                **kwargs,  # type: ignore[arg-type]
            )
            return out.to(query.dtype), None
        out = F.scaled_dot_product_attention(
            query.to(dt),
            key.to(dt),
            value.to(dt),
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )  # [B, H, T, D]
    return out.transpose(1, 2).contiguous().to(query.dtype), None
