"""The decode-attention kernel (decode_attention.py) against SDPA, and where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import PARITY_TOL, add_policy, applied
from test_speculative import sample

from marft_engine import decode_attention, fused_decode, kernels
from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="no C++ compiler here")


def _case(B: int, H: int, Hk: int, T: int, L: int, D: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    # keys and values as the sampler holds them: views of slot buffers wider than the batch and context
    kbuf = torch.randn(B + 3, Hk, L + 9, D, generator=g)
    vbuf = torch.randn(B + 3, Hk, L + 9, D, generator=g)
    k, v = kbuf[:B, :, 4 : 4 + L], vbuf[:B, :, 4 : 4 + L]
    q = torch.randn(B, H, T, D, generator=g) * 3  # sharp enough that the softmax is not near uniform
    keep = torch.rand(B, 1, T, L, generator=g) > 0.3  # left padding and holes anywhere
    keep[..., -T:] |= torch.eye(T, dtype=torch.bool)  # a query always sees itself
    return q, k, v, keep


@pytest.mark.parametrize(
    ("B", "H", "Hk", "T", "L", "D"),
    [
        (1, 4, 4, 1, 5, 8),  # fewer keys than a vector block: the scalar tail alone
        (7, 9, 3, 1, 61, 64),  # SmolLM2's heads; 7 blocks of 8 keys and a tail of 5
        (5, 8, 2, 4, 33, 16),
        (3, 6, 1, 9, 300, 32),
        (2, 4, 1, 2, 40, 256),  # Gemma 3's head size: the values in pieces of 64 columns
        (3, 4, 2, 3, 27, 12),  # a head size the vector path does not take
    ],
)
def test_equals_sdpa(B: int, H: int, Hk: int, T: int, L: int, D: int) -> None:
    q, k, v, keep = _case(B, H, Hk, T, L, D, seed=B * 100 + L)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=H != Hk)  # [B, H, T, D]
    with torch.no_grad():
        got = decode_attention.attend(q, k, v, keep, None)  # [B, T, H, D]
    assert got is not None
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-5)
    scale = 0.3
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=H != Hk, scale=scale)
    with torch.no_grad():
        got = decode_attention.attend(q, k, v, keep, scale)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("B", "H", "Hk", "T", "L", "D"), [(7, 9, 3, 1, 61, 64), (3, 4, 2, 3, 27, 12)])
def test_bf16_keys_and_values_are_read_as_their_fp32_values(
    B: int, H: int, Hk: int, T: int, L: int, D: int
) -> None:
    """A bf16 slot cache (a bf16 base's, precision.place), through the vector path and the scalar one:
    the kernel's result over fp32 copies of the same values (the scalar tail's sums may vectorize
    otherwise: the last bits), and SDPA's over them."""
    q, k, v, keep = _case(B, H, Hk, T, L, D, seed=B * 10 + L)
    kb, vb = k.bfloat16(), v.bfloat16()
    with torch.no_grad():
        got = decode_attention.attend(q, kb, vb, keep, None)
        as_fp32 = decode_attention.attend(q, kb.float(), vb.float(), keep, None)
    assert got is not None and as_fp32 is not None
    torch.testing.assert_close(got, as_fp32, rtol=1e-6, atol=1e-6)
    want = F.scaled_dot_product_attention(q, kb.float(), vb.float(), attn_mask=keep, enable_gqa=H != Hk)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_a_query_with_nothing_to_attend_is_finite() -> None:
    q, k, v, keep = _case(2, 4, 2, 1, 10, 8, seed=3)
    keep[1] = False
    with torch.no_grad():
        got = decode_attention.attend(q, k, v, keep, None)
    assert got is not None and torch.isfinite(got).all()
    torch.testing.assert_close(got[1, 0], v[1].mean(1).repeat_interleave(2, 0))  # uniform over L


@pytest.mark.parametrize(("T", "D"), [(1, 64), (3, 64), (2, 12)])
def test_a_rows_left_padding_is_not_read(T: int, D: int) -> None:
    """Rows whose contexts start at different columns (rows that joined the batch at different
    times): the whole blocks of 8 masked columns before a row's first kept one are skipped, so NaN
    there does not reach the output, which equals SDPA's over zeros in their place."""
    B, H, Hk, L = 5, 6, 2, 70
    q, k, v, keep = _case(B, H, Hk, T, L, D, seed=T)
    nan_k, nan_v = k.clone(), v.clone()
    for b, first in enumerate([0, 5, 8, 29, 61]):
        keep[b, :, :, :first] = False
        k[b, :, :first] = v[b, :, :first] = 0
        skipped = first - first % 8
        nan_k[b, :, :skipped] = nan_v[b, :, :skipped] = float("nan")
        nan_k[b, :, skipped:first], nan_v[b, :, skipped:first] = (
            k[b, :, skipped:first],
            v[b, :, skipped:first],
        )
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)  # [B, H, T, D]
    with torch.no_grad():
        got = decode_attention.attend(q, nan_k, nan_v, keep, None)
        zeros = decode_attention.attend(q, k, v, keep, None)
    assert got is not None and torch.isfinite(got).all()
    assert torch.equal(got, zeros)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_where_it_does_not_apply() -> None:
    q, k, v, keep = _case(2, 4, 2, 2, 10, 8, seed=4)
    with torch.no_grad():
        assert decode_attention.attend(q, k.bfloat16(), v, keep, None) is None  # one dtype or the other
        assert decode_attention.attend(q, k.half(), v.half(), keep, None) is None
        assert decode_attention.attend(q, k, v, None, None) is None
        assert decode_attention.attend(q, k, v, keep.float(), None) is None
        whole = torch.randn(2, 4, 10, 8)  # no cache: a pass over a whole sequence
        assert decode_attention.attend(whole, k, v, torch.ones(2, 1, 10, 10, dtype=torch.bool), None) is None
    assert decode_attention.attend(q, k, v, keep, None) is None  # gradients on
    decode_attention.ENABLED = False
    try:
        with torch.no_grad():
            assert decode_attention.attend(q, k, v, keep, None) is None
    finally:
        decode_attention.ENABLED = True


def test_sampling_with_the_kernel_equals_sampling_with_sdpa(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy and seeded sampling, with and without drafts, over two adapters and the bare base, joins
    and leaves: the kernel's steps give the tokens SDPA's give, log-probs within the parity tolerance."""
    kernel_against_sdpa(engine, monkeypatch)


def test_a_bf16_cache_reads_the_same_through_the_kernel_and_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 base's slot cache is bf16 (precision.place). With the kernel switched off after the
    base was made (bench/attention_ab.py does so), SDPA reads that cache in fp32: the same as above,
    fp32 arithmetic over the same bf16 keys and values."""
    e = Engine(device="cpu", max_batch=64)
    try:
        e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="bfloat16"))
        add_policy(e, "A", seed=1)
        add_policy(e, "B", seed=2)
        assert e.bases["b"].cache_dtype == torch.bfloat16
        kernel_against_sdpa(e, monkeypatch)
    finally:
        e.close()


def kernel_against_sdpa(e: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sample` (adapters A, B and the bare base) through the model's forward, with the kernel and
    then with SDPA, greedy and seeded, with and without drafts: the same tokens, log-probs within
    the parity tolerance."""
    calls = applied(monkeypatch, decode_attention, "attend")
    monkeypatch.setattr(fused_decode, "ENABLED", False)  # its steps call the kernel directly
    for draft, temperature in [(0, 0.0), (0, 1.0), (4, 0.0)]:
        with_kernel = sample(e, draft, temperature, seed=7)
        assert any(calls) and not all(calls)  # its decode steps took the kernel, the prefills SDPA
        calls.clear()
        monkeypatch.setattr(decode_attention, "ENABLED", False)
        without = sample(e, draft, temperature, seed=7)
        assert not any(calls)
        monkeypatch.setattr(decode_attention, "ENABLED", True)
        for x, y in zip(with_kernel, without, strict=True):
            assert x.response_ids == y.response_ids
            torch.testing.assert_close(
                torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=PARITY_TOL, rtol=0
            )
