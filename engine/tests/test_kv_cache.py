"""The decode batch's slot KV cache (kv_cache.py)."""

from __future__ import annotations

import pytest
import torch

from marft_engine import kv_cache
from marft_engine.kv_cache import SLACK, Running
from marft_engine.sampler import Row


def test_slot_cache_keeps_every_row_through_joins_leaves_and_relayouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decode batch's slot cache against a plain per-row record of what each row's cache holds,
    through joins (with prompts longer than the batch's: room made on the left), leaves (swap-remove),
    slot growth and re-layouts at the right edge; the attention mask marks exactly each row's tokens,
    a step's update returns the live rows' keys, and what attention reads is finite even though the
    buffers start as garbage (NaN here)."""

    def nan_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(kv_cache, "_uninitialised", nan_buffer)
    g = torch.Generator().manual_seed(0)
    H, D, layers = 2, 3, 2
    run: Running[Row] = Running(max_slots=6, dtype=torch.float64)
    want: dict[int, list[torch.Tensor]] = {}  # row id -> per layer [H, len, D] keys (values = -keys)
    rows: dict[int, Row] = {}
    next_id = 0

    def join(lengths: list[int]) -> None:
        nonlocal next_id
        Lp = max(lengths)
        kv = []
        for _ in range(layers):
            k = torch.randn(len(lengths), H, Lp, D, generator=g, dtype=torch.float32)
            kv.append((k, -k))
        new = []
        for j, p in enumerate(lengths):
            r = Row(
                job=None,
                req=next_id,
                k=0,
                prompt=[0] * p,
                adapter="a",
                params=None,
                generator=None,
            )  # type: ignore[arg-type]
            rows[next_id], want[next_id] = r, [kv[li][0][j, :, Lp - p :].double() for li in range(layers)]
            new.append(r)
            next_id += 1
        run.add(new, kv, list(range(len(lengths))))

    def step() -> None:
        mask, pos = run.step_inputs(torch.device("cpu"))
        n = len(run.rows)
        for r, m, p in zip(run.rows, mask, pos[:, 0], strict=True):
            assert int(m.sum()) == want[r.req][0].shape[1] + 1 and bool(m[-1])  # its tokens + this one
            assert int(p) == want[r.req][0].shape[1]
        for li, layer in enumerate(run.cache.layers):
            new = torch.randn(n, H, 1, D, generator=g, dtype=torch.float64)
            k, v = layer.update(new, -new)
            assert k.shape == (n, H, mask.shape[1], D) and torch.equal(v, -k)
            assert torch.isfinite(k).all() and torch.isfinite(v).all()
            for i, r in enumerate(run.rows):
                want[r.req][li] = torch.cat([want[r.req][li], new[i]], dim=1)
        run.advance()

    def check() -> None:
        for i, r in enumerate(run.rows):
            f = run.first[i]
            assert run.end - f == want[r.req][0].shape[1]
            for li, layer in enumerate(run.layers):
                assert torch.equal(layer.kbuf[i, :, f : run.end], want[r.req][li])
                assert torch.equal(layer.vbuf[i, :, f : run.end], -want[r.req][li])

    join([3, 5])
    check()
    for t in range(3 * SLACK):  # crosses the right edge: re-layouts
        step()
        if t == 2:
            join([9, 1, 4])  # 9 > end: the cache is re-laid out with room on the left; slots grow
        if t == 5:
            run.remove([0, 3])  # swap-remove: the last rows move into slots 0 and 3
        if t == 7:
            join([2])
        if t == 30:
            run.remove([len(run.rows) - 1])
        check()
    assert sorted(r.req for r in run.rows) == [1, 2, 4]  # 0 and 3 left at t=5, 5 (joined at t=7) at t=30
    assert run.start == min(run.first)
    run.remove(list(range(len(run.rows))))
    assert run.rows == [] and run.first == [] and run.pos == []
