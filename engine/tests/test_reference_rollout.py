"""bench/reference_rollout.py's work count: the model FLOPs of `generate` padded to the longest
prompt and answer against a sampler that pads nothing and prefills a shared prefix once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from reference_rollout import call_flops, shared_prefix  # noqa: E402

DIMS = {"linear": 1000.0, "head": 300.0, "layers": 2.0, "q_width": 8.0, "kv_width": 4.0}


def test_rows_of_one_shape_cost_the_same_padded_or_not() -> None:
    padded, unpadded = call_flops(DIMS, [20, 20, 20], [7, 7, 7], shared=0)
    assert padded == pytest.approx(unpadded, rel=1e-12)


def test_padding_costs_the_longest_rows_work_on_every_row() -> None:
    # one row answers in 1 token (from the prefill), the other decodes 9 more: generate decodes both
    padded, unpadded = call_flops(DIMS, [10, 10], [1, 10], shared=0)
    step = lambda t: 2 * (DIMS["linear"] + DIMS["head"]) + 4 * 2 * 8 * (10 + t)  # noqa: E731
    assert padded - unpadded == pytest.approx(sum(step(t) for t in range(1, 10)), rel=1e-12)
    # a shorter prompt is padded to the longer one's length in the prefill and every decode step
    p2, u2 = call_flops(DIMS, [4, 10], [1, 1], shared=0)
    assert p2 > u2


def test_a_shared_prefix_is_prefilled_once() -> None:
    _, alone = call_flops(DIMS, [40, 40], [1, 1], shared=0)
    _, shared = call_flops(DIMS, [40, 40], [1, 1], shared=32)
    # two rows' 32 prefix tokens (attending over 20 positions on average) become one prefix's 32
    attention = lambda c: 4 * 2 * 8 * c  # noqa: E731
    want = 32 * (2 * DIMS["linear"] + 2 * attention(20) - attention(16))
    assert alone - shared == pytest.approx(want, rel=1e-12)


def test_shared_prefix_counts_whole_blocks_and_leaves_a_token_to_prefill() -> None:
    a = list(range(100))
    assert shared_prefix([a, a[:35] + [-1] * 10]) == 32
    assert shared_prefix([a[:20], a[:20]]) == 16  # 19 shareable, one block
    assert shared_prefix([a[:16], a[:16]]) == 0  # the last token is always prefilled
    assert shared_prefix([a, [-1] + a[1:]]) == 0
