"""Mixed-adapter LoRA for decoding: one gathered, batched matmul per layer.

PEFT's `adapter_names` path loops over the distinct adapters of a batch in every LoRA layer (gather the
rows, two small matmuls, scatter back). With several agents in one decode batch that loop costs more
than the LoRA math. Here each LoRA Linear keeps its adapters' weights stacked, A [n, r, d_in] and
B * scaling [n, d_out, r], and every row keeps its own adapter's block ("__base__" rows none): two
matmuls per layer whatever the number of adapters. Every row is computed on its own, so a row's
result does not depend on the rest of the batch. What a layer settles for a pass (path, dtype, stacks,
each row's block) it keeps for the next passes over the same rows and weights (`_Plan`): settling
it anew in every LoRA layer of every decode step was a measurable share of the step
(docs/MEASUREMENTS.md).

A pass over real tokens only (a prefill, unpad.py) takes each run of one adapter's rows through its
own block instead (`_add_runs`). Only inference in eval mode takes this path (dropout and LoRA
variants fall back to PEFT). A training pass over several adapters' rows (training_batch.py) takes
`_train_rows_forward`, with gradients: on a CPU each run of one adapter's rows through its own LoRA
modules, on a GPU the stacked products as above (`_train_stacked`).
The stacks are rebuilt when `bump()` says weights may have changed (optimizer steps, loads, adapter
creation and deletion). Every other pass (one adapter, with or without gradients) takes
`_active_forward`: PEFT's forward with fewer copies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from peft.tuners.lora import layer as lora_layer

from . import precision, unpad

_epoch = 0
_all_changed = 0  # the epoch at which every adapter's weights last may have changed
_changed: dict[str, int] = {}  # adapter name -> the epoch at which its weights last changed
_original = lora_layer.Linear._mixed_batch_forward


def bump(*names: str) -> None:
    """Some LoRA weight may have changed: rebuild the stacks on next use. With names: only those
    adapters' weights changed (an optimizer step); without: any adapter's may have (creation,
    deletion, loads, edits behind the engine's back)."""
    global _epoch, _all_changed
    _epoch += 1
    if names:
        for n in names:
            _changed[n] = _epoch
    else:
        _all_changed = _epoch


def epoch() -> int:
    """Changes whenever any LoRA weight may have changed, or an adapter was created or deleted (a
    stamp for what is built from all of them, such as fused_decode.py's layers)."""
    return _epoch


def weights_epoch(adapter: str) -> int:
    """Changes whenever `adapter`'s weights may have changed (a stamp for caches of its outputs,
    such as the sampler's prefix cache)."""
    return max(_all_changed, _changed.get(adapter, 0))


def _stacks(
    module: lora_layer.Linear, names: tuple[str, ...], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, dict[str, int], precision.Packed | None, precision.Packed | None]:
    """(A [n r, d_in], B [d_out, n r], slot per adapter, A and B prepacked or None) in the
    dtype the matmuls run in; the packed pair where the base layer is packed too (precision.py)."""
    key = (names, _epoch, dtype)
    cached = getattr(module, "_marft_stacks", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    present = [a for a in names if a in module.lora_A]
    base = module.get_base_layer()
    d_in, d_out = base.in_features, base.out_features
    r = max([module.r[a] for a in present], default=1)
    ref = module.lora_A[present[0]].weight if present else base.weight
    A = torch.zeros((len(present), r, d_in), dtype=torch.float32, device=ref.device)  # [n, r, d_in]
    B = torch.zeros((len(present), d_out, r), dtype=torch.float32, device=ref.device)  # [n, d_out, r]
    slot = {}
    with torch.no_grad():
        for j, a in enumerate(present):
            ra = module.r[a]
            A[j, :ra] = module.lora_A[a].weight.float()
            B[j, :, :ra] = module.lora_B[a].weight.float() * module.scaling[a]
            slot[a] = j
    # Laid out once for the two matmuls below, in their dtype (under autocast they would cast per call).
    A2 = A.reshape(-1, d_in).to(dtype)  # [n r, d_in]
    B2 = B.permute(1, 0, 2).reshape(d_out, -1).to(dtype)  # [d_out, n r]
    packed = bool(present) and hasattr(base, "_marft_packed")  # empty stacks (no LoRA here) are never used
    stacks = (
        A2,
        B2,
        slot,
        precision.pack_weight(A2) if packed else None,
        precision.pack_weight(B2) if packed else None,
    )
    module._marft_stacks = (key, stacks)
    return stacks


def _row_choice(
    adapter_names: list[str], slot: dict[str, int], device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """[B, n]: row i's LoRA slot one-hot (a "__base__" row, or an adapter without a LoRA on this
    layer: all zeros). The same for every layer with the same slots, so
    in a `rows` call it is built once per call, not once per layer."""
    key = (tuple(slot.items()), device, dtype)
    if adapter_names is _rows and key in _row_choices:
        return _row_choices[key]
    idx = torch.tensor([slot.get(a, -1) for a in adapter_names], device=device)  # [B]
    keep = (idx[:, None] == torch.arange(len(slot), device=device)).to(dtype)  # [B, n]
    if adapter_names is _rows:
        _row_choices[key] = keep
    return keep


def _mixed_batch_forward(
    self: lora_layer.Linear, x: torch.Tensor, *args: object, adapter_names: list[str], **kwargs: object
) -> torch.Tensor:
    if adapter_names is _rows and not args and not kwargs:
        plan = getattr(self, "_marft_plan", None)
        if (
            plan is not None and plan.block == _rows_block and not self.training and x.dim() == 3
        ):  # settled by an earlier step of the same rows
            x = x.to(plan.dtype)
            result = self.base_layer(x)  # [B, T, d_out]
            return result + _lora_out(x, plan).to(result.dtype) if plan.any_lora else result
    names = (
        _row_names if adapter_names is _rows and _row_names is not None else tuple(sorted(set(adapter_names)))
    )
    if (
        self.training
        or x.dim() != 3
        or any(a in self.lora_variant for a in names)
        or any(
            not isinstance(self.lora_dropout[a], torch.nn.Identity) and self.lora_dropout[a].p > 0
            for a in names
            if a in self.lora_dropout
        )
    ):
        return _original(self, x, *args, adapter_names=adapter_names, **kwargs)
    for k in lora_layer.VARIANT_KWARG_KEYS:  # PEFT's per-variant arguments, not for the base layer
        kwargs.pop(k, None)
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else torch.float32
    x = x.to(dtype)  # once for both products (the base layer's autocast would cast it the same way)
    result = self.base_layer(x, *args, **kwargs)  # [B, T, d_out]
    A, B, slot, A_packed, B_packed = _stacks(self, names, dtype)
    if slot and adapter_names is _rows and unpad.layout() is not None and result.dtype == dtype:
        return _add_runs(result, x, A, B, slot)  # a prefill: no plan kept, its layout is its own
    keep = None
    if slot and (len(names) > 1 or names[0] not in slot):  # several adapters' rows, or rows without one here
        keep = _row_choice(adapter_names, slot, x.device, dtype)[:, None]  # [B, 1, n]
        if (lay := unpad.layout()) is not None:  # x [1, N, d_in]: the rows' tokens end to end
            keep = keep[lay.rows].view(1, -1, len(slot))  # [1, N, n]: each token its row's
        keep = keep[..., None]  # [B, T or 1, n, 1]
    plan = _Plan(_rows_block, dtype, A, B, A_packed, B_packed, keep, bool(slot))
    if adapter_names is _rows and not args and not kwargs:
        self._marft_plan = plan
    if not slot:  # no row has a LoRA on this layer (__base__ rows, or adapters on other layers)
        return result
    return result + _lora_out(x, plan).to(result.dtype)


def _add_runs(
    result: torch.Tensor, x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, slot: dict[str, int]
) -> torch.Tensor:
    """A pass over real tokens only (unpad.py: x [1, N, d_in], the rows' tokens end to end, as a
    prefill lays them out): each run of one adapter's rows (`_runs`; the sampler orders a prefill's
    rows by adapter, so there is one run per adapter) through its own block of A and B, added into
    result [1, N, d_out] in place. Why: `_lora_out` takes every token through every adapter's block
    (n times the LoRA products, and a mask), then adds its own output of the layer's size; at a
    prefill's thousands of tokens that was most of what LoRA cost. The same sums, within the rounding
    of one add fewer (bf16: the B product's sum is rounded once, with the layer's output)."""
    r = A.shape[0] // len(slot)
    y, x2 = result.view(-1, result.shape[-1]), x.view(-1, x.shape[-1])  # [N, d_out], [N, d_in]
    at = 0
    for (a, _, _), size in zip(_runs(), _run_sizes(), strict=True):
        j = slot.get(a)
        if j is not None:  # __base__ rows and adapters without a LoRA here add nothing
            xa = F.linear(x2[at : at + size], A[j * r : (j + 1) * r])  # [size, r]
            y[at : at + size].addmm_(xa, B[:, j * r : (j + 1) * r].t())  # += xa B_j^T
        at += size
    return result


class _Plan(NamedTuple):
    """What a LoRA layer settles for a pass of the per-row path, which later passes of the same
    `rows` block take over (a decode step does not settle it again in every LoRA layer)."""

    block: int  # the `rows` block it holds for
    dtype: torch.dtype  # the products' dtype
    A: torch.Tensor  # [n r, d_in] the adapters' A stacked (`_stacks`)
    B: torch.Tensor  # [d_out, n r] their B * scaling side by side
    A_packed: precision.Packed | None  # A and B prepacked, or None (precision.pack_weight)
    B_packed: precision.Packed | None
    keep: torch.Tensor | None  # [B, T or 1, n, 1] each row's block; None: every row has the one adapter
    any_lora: bool  # whether any row has a LoRA on this layer


def _lora_out(x: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """Every row through every adapter's A (r is small, so this is cheap), keep only the row's own
    block, then one matmul with all Bs side by side: no per-row copy of the weights.
    x [B, T, d_in] -> [B, T, d_out]."""
    xa = precision.linear(x, plan.A, plan.A_packed)  # [B, T, n r]
    if plan.keep is not None:
        n = plan.keep.shape[2]
        xa = (xa.view(*xa.shape[:2], n, plan.A.shape[0] // n) * plan.keep).view(xa.shape)
    return precision.linear(xa, plan.B, plan.B_packed)  # [B, T, d_out]


# Rows of the decode call in progress (see `rows`): the adapter name of each row; and what every
# layer of that call derives from them alike (their distinct adapters, `_row_choice`), kept for it.
_rows: list[str] | None = None
# The rows and weights of a `rows` block: a new number when they change (or in a pass over real tokens
# only, unpad.py), so each layer's plan from an earlier block of the same rows (`_Plan`) still holds.
_rows_block = 0
_rows_key: tuple[object, ...] | None = None
_row_names: tuple[str, ...] | None = None
_row_choices: dict[tuple[object, ...], torch.Tensor] = {}
_original_forward = lora_layer.Linear.forward
# How a training pass over several adapters' rows takes their LoRA terms (`_train_rows_forward`);
# None: by device. Stacked (a GPU): one pair of products over all the adapters' weights, each row
# masked to its own block, a few kernels per layer whatever the number of adapters, for every
# adapter's LoRA FLOPs on every row (a pass of small batches on a GPU is bound by its kernel launches).
# Runs (a CPU, bound by its FLOPs): each adapter's rows through its own A and B.
TRAIN_STACKED: bool | None = None


@contextlib.contextmanager
def rows(model: torch.nn.Module, adapter_names: list[str]) -> Iterator[bool]:
    """Within the block, every LoRA Linear of `model` takes the per-row path with these adapter names,
    as PEFT's `adapter_names` argument does, without PEFT's per-call forward hooks on every layer
    (a noticeable share of a CPU decode step). Yields False, and does nothing, where the model
    has LoRA layers of another kind (which would ignore the rows): then call PEFT with
    `adapter_names`."""
    global _rows, _row_runs, _row_names, _rows_block, _rows_key
    if not _only_linear_lora(model):
        yield False
        return
    key = (
        tuple(adapter_names),
        _epoch,
        id(model),
        torch.get_autocast_dtype("cpu"),
        torch.is_autocast_enabled("cpu"),
    )
    if key != _rows_key or unpad.layout() is not None:
        _rows_block += 1
        _rows_key = None if unpad.layout() is not None else key
    _rows, _row_runs, _row_names = adapter_names, None, tuple(sorted(set(adapter_names)))
    _row_choices.clear()
    try:
        yield True
    finally:
        _rows, _row_runs, _row_names = None, None, None
        _row_choices.clear()


def rows_supported(model: torch.nn.Module) -> bool:
    """Whether `rows` takes the per-row path on this model (every LoRA layer a Linear)."""
    return _only_linear_lora(model)


def _only_linear_lora(model: torch.nn.Module) -> bool:
    key = _epoch  # adapters are created and deleted with a bump()
    cached = getattr(model, "_marft_only_linear", None)
    if cached is None or cached[0] != key:
        kinds = [m for m in model.modules() if isinstance(m, lora_layer.LoraLayer)]
        cached = (key, all(isinstance(m, lora_layer.Linear) for m in kinds))
        model._marft_only_linear = cached  # type: ignore[assignment]
    return cached[1]


def _forward(self: lora_layer.Linear, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    if self.disable_adapters or self.merged or "adapter_names" in kwargs:
        return _original_forward(self, x, *args, **kwargs)
    if _rows is not None:
        if torch.is_grad_enabled():  # a training pass: the LoRA weights need their gradients
            return _train_rows_forward(self, x, *args, **kwargs)
        return _mixed_batch_forward(self, x, *args, adapter_names=_rows, **kwargs)
    if not args and not kwargs and not any(a in self.lora_variant for a in self.active_adapters):
        return _active_forward(self, x)
    return _original_forward(self, x, *args, **kwargs)


def _active_forward(self: lora_layer.Linear, x: torch.Tensor) -> torch.Tensor:
    """PEFT's forward through the active adapters (vanilla LoRA), each adapter's term by `_lora_term`.
    x [..., d_in] -> [..., d_out]."""
    result = self.base_layer(x)
    dtype = result.dtype
    for a in self.active_adapters:
        if a in self.lora_A:
            result = result + _lora_term(self, a, x)
    return result.to(dtype)


def _lora_term(self: lora_layer.Linear, a: str, x: torch.Tensor) -> torch.Tensor:
    """Adapter a's LoRA term B (s A x) for x [..., d_in] -> [..., d_out], with two copies fewer than
    PEFT's (docs/MEASUREMENTS.md): the scaling s multiplies the rank-r intermediate, not the layer's
    output (a product over r columns, not d_out, forward and backward); and under autocast x goes to
    the LoRA product as it is, which casts it to the autocast dtype, where PEFT first casts a bf16 x
    to the LoRA weights' fp32. The same bits as PEFT's forward where s is a power of two (alpha = 2 r,
    the default) and without dropout, within rounding otherwise (tests)."""
    if not torch.is_autocast_enabled(x.device.type):
        x = self._cast_input_dtype(x, self.lora_A[a].weight.dtype)
    return self.lora_B[a](self.lora_A[a](self.lora_dropout[a](x)) * self.scaling[a])


_row_runs: tuple[int, list[tuple[str, int, int]]] | None = None  # (id of _rows, runs); reset by rows()


def _runs() -> list[tuple[str, int, int]]:
    """The call in progress as runs of consecutive rows of one adapter: (adapter, start, length),
    computed once per call, not per layer. training_batch orders each micro-batch's rows by call,
    so there is one run per adapter."""
    global _row_runs
    assert _rows is not None
    if _row_runs is None or _row_runs[0] != id(_rows):
        runs: list[tuple[str, int, int]] = []
        for i, a in enumerate(_rows):
            if runs and runs[-1][0] == a:
                runs[-1] = (a, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((a, i, 1))
        _row_runs = (id(_rows), runs)
    return _row_runs[1]


def _run_sizes() -> list[int]:
    """Each of `_runs`'s runs' rows, or in a pass over real tokens only (unpad.py) its rows' tokens."""
    lay = unpad.layout()
    return [n if lay is None else sum(lay.lengths[s : s + n]) for _, s, n in _runs()]


def _train_rows_forward(
    self: lora_layer.Linear, x: torch.Tensor, *args: object, **kwargs: object
) -> torch.Tensor:
    """Per-row LoRA with gradients (forward_backward over several adapters, training_batch.py), added
    to the frozen layer's output: on a GPU all the adapters' products stacked (`_train_stacked`,
    `TRAIN_STACKED`); on a CPU, or with dropout or a LoRA bias, each run of one adapter's rows through
    its own A and B (`_lora_term`, dropout included). The runs are views of x and their outputs are
    joined once: gathering and scattering rows per adapter copied the whole layer output once per
    adapter, in every layer.
    x [B, T, d_in] -> [B, T, d_out]."""
    for k in lora_layer.VARIANT_KWARG_KEYS:
        kwargs.pop(k, None)
    result = self.base_layer(x, *args, **kwargs)  # [B, T, d_out]
    runs, sizes = _runs(), _run_sizes()
    dim = 0 if unpad.layout() is None else 1  # x [1, N, d_in] in a pass over real tokens only
    present = list(dict.fromkeys(a for a, _, _ in runs if a in self.lora_A))
    for a in present:
        if a in self.lora_variant:
            raise ValueError(f"adapter {a!r}: LoRA variants are not supported in a multi-adapter pass")
    if not present:  # __base__ rows, or adapters without LoRA on this layer
        return result
    if _stacked(x.device) and all(_plain(self, a) for a in present):  # one pair of products for every adapter
        return result + _train_stacked(self, x, present, sizes, dim).to(result.dtype)
    parts: list[torch.Tensor] = []
    # split, not narrow: split's backward joins the pieces' gradients once, where each narrow's
    # backward writes its piece into a zero tensor the size of x
    for (a, _, _), size, sub in zip(runs, sizes, x.split(sizes, dim), strict=True):  # sub [n, T, d_in]
        if a not in self.lora_A:  # __base__ rows, or an adapter without LoRA on this layer
            shape = list(result.shape)
            shape[dim] = size
            parts.append(result.new_zeros(shape))
            continue
        parts.append(_lora_term(self, a, sub).to(result.dtype))
    return result + (parts[0] if len(parts) == 1 else torch.cat(parts, dim))  # [B, T, d_out]


def _stacked(device: torch.device) -> bool:
    return device.type == "cuda" if TRAIN_STACKED is None else TRAIN_STACKED


def _plain(self: lora_layer.Linear, a: str) -> bool:
    """Adapter a's LoRA on this layer is B (s A x): no dropout, no bias (what `_train_stacked` computes)."""
    drop = self.lora_dropout[a]
    return (isinstance(drop, torch.nn.Identity) or drop.p == 0) and self.lora_B[a].bias is None


def _train_stacked(
    self: lora_layer.Linear, x: torch.Tensor, present: list[str], sizes: list[int], dim: int
) -> torch.Tensor:
    """Every row's LoRA term through all the adapters' A stacked and all their B side by side, each
    row's rank columns masked to its own adapter's block times its scaling (the inference path's
    `_lora_out`, with gradients): the terms of `_lora_term` within rounding, and gradients reach only
    the block a row kept. x [B, T, d_in] (or [1, N, d_in]) -> [B, T, d_out]."""
    A = torch.cat([self.lora_A[a].weight for a in present])  # [R, d_in], R = the adapters' ranks summed
    B = torch.cat([self.lora_B[a].weight for a in present], 1)  # [d_out, R]
    if not torch.is_autocast_enabled(x.device.type):
        x = x.to(A.dtype)
    h = F.linear(x, A)  # [B, T, R]
    return F.linear(h * _train_keep(self, present, sizes, dim, h), B)  # [B, T, d_out]


def _train_keep(
    self: lora_layer.Linear, present: list[str], sizes: list[int], dim: int, h: torch.Tensor
) -> torch.Tensor:
    """[B, 1, R] (or [1, N, R] over real tokens only): the scaling of a row's own adapter on that
    adapter's rank columns, 0 elsewhere. The same for every layer with the same ranks and scalings,
    so built once per call (kept with `_row_choice`'s)."""
    blocks = tuple((a, self.r[a], float(self.scaling[a])) for a in present)
    key = ("train", blocks, tuple(sizes), dim, h.device, h.dtype)
    if key in _row_choices:
        return _row_choices[key]
    cols: dict[str, tuple[int, int, float]] = {}
    for a, r, s in blocks:
        cols[a] = (sum(c[1] for c in cols.values()), r, s)
    keep = torch.zeros(sum(sizes), sum(r for _, r, _ in blocks))  # [rows or tokens, R]
    at = 0
    for (a, _, _), size in zip(_runs(), sizes, strict=True):
        if a in cols:
            c, r, s = cols[a]
            keep[at : at + size, c : c + r] = s
        at += size
    keep = keep.to(device=h.device, dtype=h.dtype)
    keep = keep[:, None] if dim == 0 else keep[None]
    _row_choices[key] = keep
    return keep


def install() -> None:
    """Route PEFT's per-row adapter path for LoRA Linear layers through the batched version (patches
    peft's lora.Linear class for the whole process; the Engine calls it; calling it again changes
    nothing)."""
    lora_layer.Linear._mixed_batch_forward = _mixed_batch_forward
    lora_layer.Linear.forward = _forward
