"""The sampler's KV cache: one decode batch's rows in fixed slots, so rows join and leave cheaply.

Shapes: S = row slots, H = key/value heads, C = cache columns (token positions), D = head size.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class Prompted(Protocol):
    prompt: list[int]  # the row's prompt ids (the sampler's Row)


R = TypeVar("R", bound=Prompted)

SLACK = 64  # least spare cache columns a re-layout leaves (it leaves half the width when more)


class SlotLayer(DynamicLayer):
    """One layer of a decode batch's KV cache, in buffers [S, H, C, D] (S row slots, C columns).

    Why slots: rows join and leave the batch all the time (continuous batching). Concatenating caches
    on a join and index-selecting them on a leave copies the whole batch's cache at every such event,
    which grows with the batch and its context. Here a joining row's prompt is copied into a free slot and a
    leaving row's slot is refilled by the last row (swap-remove), so an event copies one row's cache.
    Geometry (set by `Running`): the batch's rows are slots [0, n); every row's tokens end at column
    `end` (left padding); attention reads columns [start, end). `update` writes the step's keys at
    column `end` and returns views of slots [0, n) x columns [start, end + T)."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor) -> None:
        super().__init__()
        self.lazy_initialization(kbuf, vbuf)
        self.kbuf, self.vbuf = kbuf, vbuf
        self.view(0, 0, 0)

    def view(self, n: int, start: int, end: int) -> None:
        self.n, self.start, self.end = n, start, end
        self.keys, self.values = self.kbuf[:n, :, start:end], self.vbuf[:n, :, start:end]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.end + key_states.shape[-2]
        self.kbuf[: self.n, :, self.end : m] = key_states  # cast to the cache's dtype if they differ
        self.vbuf[: self.n, :, self.end : m] = value_states
        self.view(self.n, self.start, m)
        return self.keys, self.values


KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values) [B, H, L, D]
Pair = tuple[torch.Tensor, torch.Tensor]  # (keys, values)
Spans = list[tuple[int, int]]  # column ranges [lo, hi) of one prefilled row that hold its prompt, in order
_uninitialised = torch.empty  # the slot cache's allocator (a test fills it with NaN instead)


class Running(Generic[R]):
    """The decode batch of one base: its rows in slots [0, n) of a slot cache (see SlotLayer).

    Row i's tokens fill columns [first[i], end) of slot i, and pos[i] is the position id of the next
    token it is fed. Adding and removing a row copy that row's cache only. A re-layout copies the live
    rows' columns [start, end) into new buffers, dropping columns no live row uses; it happens when
    more slots are needed, when a prompt is longer than there is room for on the left, and at the right
    edge. It leaves room of half the width (at least SLACK columns) on the side that ran out, so re-
    layouts are rare: O(log) as the batch grows. Buffers are allocated uninitialised (untouched room
    costs no memory); the invariant that makes that safe: in every live slot, columns [start, end) are
    finite (a masked column still meets a 0 weight in attention, and 0 * NaN = NaN).

    A step may feed several tokens a row (speculative decoding, speculative.py); the columns of a
    row's rejected drafts stay in its slot as holes, masked from then on (`hole`)."""

    def __init__(self, max_slots: int, dtype: torch.dtype | None) -> None:
        self.rows: list[R] = []
        self.first: list[int] = []
        self.pos: list[int] = []
        self.end = 0
        self.max_slots = max_slots
        self.dtype = dtype  # the cache's dtype; None: the prefill's
        self.slots = self.columns = 0
        self.layers: list[SlotLayer] = []
        self.hole = torch.zeros((0, 0), dtype=torch.bool)  # [slots, columns] True: masked for good
        self.cache = DynamicCache()

    @property
    def start(self) -> int:
        return min(self.first, default=self.end)

    def _relayout(self, slots: int, origin: int, like: KV) -> None:
        """Move the live rows into new buffers of at least `slots` slots whose column 0 is old column
        `origin` (<= start; negative: room on the left). `like`: per layer, tensors whose head count,
        head size and device the buffers take."""
        n, start = len(self.rows), self.start
        S = max(slots, min(2 * self.slots, self.max_slots))  # geometric: O(log) re-layouts as rows join
        C = self.end - origin + max(SLACK, (self.end - origin) // 2)
        layers = []
        hole = torch.zeros((S, C), dtype=torch.bool, device=like[0][0].device)
        if n:
            hole[:n, start - origin : self.end - origin] = self.hole[:n, start : self.end]
        self.hole = hole
        for i, (k, v) in enumerate(like):
            kb = _uninitialised((S, k.shape[1], C, k.shape[3]), dtype=self.dtype or k.dtype, device=k.device)
            vb = _uninitialised((S, v.shape[1], C, v.shape[3]), dtype=self.dtype or v.dtype, device=v.device)
            if n:
                kb[:n, :, start - origin : self.end - origin] = self.layers[i].kbuf[:n, :, start : self.end]
                vb[:n, :, start - origin : self.end - origin] = self.layers[i].vbuf[:n, :, start : self.end]
            layers.append(SlotLayer(kb, vb))
        self.layers, self.slots, self.columns = layers, S, C
        self.cache = DynamicCache()
        self.cache.layers = layers  # type: ignore[assignment]
        self.cache.layer_class_to_replicate = None
        self.first = [f - origin for f in self.first]
        self.end -= origin

    def add(self, rows: list[R], kv: KV, src: list[int], spans: list[Spans] | None = None) -> None:
        """Admit rows whose prompts were prefilled into kv (per layer [P, H, Lp, D], left-padded): row j's
        prompt cache is the last len(prompt) columns of kv row src[j], or, with spans, the columns
        spans[src[j]] of that row, in order (a prefill that reused a cached prefix leaves a gap between
        the prefix and the rest of the prompt; see sampler.py)."""
        n, longest = len(self.rows), max(len(r.prompt) for r in rows)
        lo = min(self.start, self.end - longest)  # the batch's first column once they are in
        if lo < 0:  # room on the left for this prompt, and as much again for the next longer one
            self._relayout(n + len(rows), lo - max(SLACK, (self.end - lo) // 2), kv)
        elif n + len(rows) > self.slots:
            self._relayout(n + len(rows), lo, kv)
        start = self.start  # in the new columns if re-laid out
        lo = min(start, self.end - longest)
        if lo < start:  # the live rows' new padding columns must be finite (class docstring)
            for layer in self.layers:
                layer.kbuf[:n, :, lo:start] = 0
                layer.vbuf[:n, :, lo:start] = 0
        # cols[j, c]: the kv column that the batch's column lo + c of row j's slot takes, or Lp for a
        # zero (padding before its prompt): one gather a layer instead of a copy a row and piece
        Lp, W = kv[0][0].shape[2], self.end - lo
        cols = torch.full((len(rows), W), Lp, dtype=torch.long)
        for j, r in enumerate(rows):
            p = len(r.prompt)
            pieces = spans[src[j]] if spans is not None else [(Lp - p, Lp)]
            assert sum(hi - lo for lo, hi in pieces) == p
            cols[j, W - p :] = torch.cat([torch.arange(a, b) for a, b in pieces])
        dev = kv[0][0].device
        cols, which = cols.to(dev), torch.tensor(src, device=dev)[:, None]  # [R, W], [R, 1]
        for layer, (k, v) in zip(self.layers, kv, strict=True):
            for buf, x in ((layer.kbuf, k), (layer.vbuf, v)):
                padded = torch.cat([x, x.new_zeros((x.shape[0], x.shape[1], 1, x.shape[3]))], dim=2)
                taken = padded[which, :, cols]  # [R, W, H, D]
                buf[n : n + len(rows), :, lo : self.end] = taken.transpose(1, 2)
        for j, r in enumerate(rows):
            self.hole[n + j] = False
            self.rows.append(r)
            self.first.append(self.end - len(r.prompt))
            self.pos.append(len(r.prompt))

    def remove(self, indices: list[int]) -> None:
        """Drop rows: the last row moves into each freed slot (highest index first, so it is live)."""
        start = self.start
        for i in sorted(indices, reverse=True):
            last = len(self.rows) - 1
            if i != last:
                for layer in self.layers:
                    layer.kbuf[i, :, start : self.end] = layer.kbuf[last, :, start : self.end]
                    layer.vbuf[i, :, start : self.end] = layer.vbuf[last, :, start : self.end]
                self.hole[i] = self.hole[last]
                self.rows[i], self.first[i], self.pos[i] = self.rows[last], self.first[last], self.pos[last]
            self.rows.pop()
            self.first.pop()
            self.pos.pop()

    def step_inputs(self, device: torch.device, T: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Make room for T more columns (T <= SLACK) and point the layers at the live rows; returns the
        attention mask [n, end - start + T] (1 = a real token) and the position ids [n, T] of this step."""
        if self.end + T > self.columns:
            self._relayout(len(self.rows), self.start, [(x.kbuf, x.vbuf) for x in self.layers])
        n, start = len(self.rows), self.start
        for layer in self.layers:
            layer.view(n, start, self.end)
        cols = torch.arange(start, self.end + T, device=device)
        mask = (cols[None, :] >= torch.tensor(self.first, device=device)[:, None]) & ~self.hole[
            :n, start : self.end + T
        ]
        pos = torch.tensor(self.pos, device=device)[:, None] + torch.arange(T, device=device)
        return mask.long(), pos

    def advance(self, T: int = 1, kept: list[int] | None = None) -> None:
        """After a decode step of T columns: row i keeps the first kept[i] of them (default: all), the
        rest become holes, and its next position is kept[i] on."""
        kept = [T] * len(self.pos) if kept is None else kept
        for i, k in enumerate(kept):
            if k < T:
                self.hole[i, self.end + k : self.end + T] = True
        self.end += T
        self.pos = [p + k for p, k in zip(self.pos, kept, strict=True)]


def layers_of(cache: DynamicCache) -> KV:
    """Per layer (keys, values) of a prefill's cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]
