"""Precision (precision.py): a bf16 base on a CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import PARITY_TOL, add_policy, ppo_data, seqs

from marft_engine import decode_attention, kernels, precision
from marft_engine.engine import Engine
from marft_engine.models import load_source
from marft_engine.schemas import (
    BaseCreate,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    OptimStepRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)


def test_bf16_on_cpu_samples_and_trains() -> None:
    """dtype=bfloat16 on CPU: every pass runs under bf16 autocast (decode attention in fp32, from a
    bf16 KV cache where the kernel reads it), LoRA
    weights stay fp32; sampling and forward agree to bf16 precision; training moves it."""
    eng = Engine(device="cpu")
    try:
        info = eng.create_base(BaseCreate(name="h", source="tiny:llama", seed=0, dtype="bfloat16"))
        assert info.dtype == "bfloat16"
        hf = eng.bases["h"].hf
        # on CPU: embeddings and norms fp32 (an fp32 residual stream), linear weights bf16, decode
        # attention in the cache's dtype
        assert hf.get_input_embeddings().weight.dtype == torch.float32
        assert hf.model.norm.weight.dtype == torch.float32
        assert hf.get_output_embeddings().weight.dtype == torch.bfloat16
        assert hf.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
        # the fused decode step's copy of each linear weight, where this CPU has bf16 panels
        panels = [hasattr(m, "_marft_bf16_panels") for m in hf.modules() if isinstance(m, torch.nn.Linear)]
        assert panels == [precision.bf16_panels_apply()] * len(panels)
        assert hf.config._attn_implementation == "marft_sdpa"
        # decode steps read bf16 keys and values where the engine's attention kernel reads them
        kernel = kernels.load() is not None and decode_attention.ENABLED
        assert eng.bases["h"].cache_dtype == (torch.bfloat16 if kernel else torch.float32)
        add_policy(eng, "p", base="h", seed=3)
        assert all(p.dtype == torch.float32 for p in eng.adapters["p"].params)
        reqs = [
            SampleRequest(
                adapter="p", prompt_ids=s, sampling=SamplingParams(temperature=1.0, max_new_tokens=8)
            )
            for s in seqs(4, 77)
        ]
        caches: list[torch.dtype] = []  # the slot cache's dtype at each decode step
        step = eng.sampler._step

        def seen(base: object) -> None:
            caches.extend(s.kbuf.dtype for s in eng.sampler.running["h"].layers)
            step(base)  # type: ignore[arg-type]

        eng.sampler._step = seen  # type: ignore[method-assign]
        out = eng.sample(SampleBatch(requests=reqs, seed=1))
        eng.sampler._step = step  # type: ignore[method-assign]
        assert caches and set(caches) == {eng.bases["h"].cache_dtype}
        diffs = []
        for res in out.results:
            c = res.completions[0]
            f = eng.forward(ForwardRequest(adapter="p", data=[Datum(tokens=res.prompt_ids + c.response_ids)]))
            diffs += [
                abs(a - b)
                for a, b in zip(f.results[0].logprobs[len(res.prompt_ids) :], c.logprobs, strict=True)
            ]
        # bf16: not bit-equal, but close. Sampling's fused passes keep fp32 sums where forward's bf16
        # products round their outputs, so the gap is mostly forward's own rounding (test_fused_decode
        # bounds the fused passes against an fp32 pass, much tighter).
        assert max(diffs) < 1.0 and sum(diffs) / len(diffs) < 0.1, diffs
        before = [p.detach().clone() for p in eng.adapters["p"].params]
        data = ppo_data(eng, "p", 5, n=3)
        eng.forward_backward(ForwardBackwardRequest(adapter="p", loss="ppo", data=data))
        eng.optim_step(OptimStepRequest(adapter="p"))
        assert any(not torch.equal(a, b) for a, b in zip(before, eng.adapters["p"].params, strict=True))
    finally:
        eng.close()


def test_auto_dtype_is_bf16_only_on_a_cpu_with_native_bf16(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """dtype auto: bf16 where the CPU has AVX512_BF16 or AMX (read from its flags), fp32 elsewhere;
    detection forced both ways; the engine logs the choice and /v1/bases reports it."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n")
    assert "avx512_bf16" in precision.cpu_flags(str(cpuinfo))
    assert precision.cpu_flags(str(tmp_path / "none")) == frozenset()
    cpu = torch.device("cpu")
    assert precision.compute_dtype("float32", cpu, frozenset({"avx512_bf16"}))[0] == torch.float32
    assert precision.compute_dtype("bfloat16", cpu, frozenset())[0] == torch.bfloat16
    cases = [
        (frozenset({"avx2", "avx512f", "avx512_bf16"}), "bfloat16", "avx512_bf16"),
        (frozenset({"avx2", "amx_tile", "amx_bf16"}), "bfloat16", "amx_bf16"),
        (frozenset({"avx2", "avx512f"}), "float32", "no native bf16"),  # Zen 3: AVX2, no bf16
        (frozenset(), "float32", "no native bf16"),
    ]
    for flags, dtype, reason in cases:
        monkeypatch.setattr(precision, "cpu_flags", lambda flags=flags: flags)
        eng = Engine(device="cpu")
        try:
            with caplog.at_level(logging.INFO, logger="marft_engine"):
                info = eng.create_base(BaseCreate(name="a", source="tiny:llama"))
            assert (info.dtype, reason in info.dtype_reason) == (dtype, True), info
            assert eng.list_bases().bases[0].dtype_reason == info.dtype_reason
            assert f"computes in torch.{dtype} ({info.dtype_reason})" in caplog.text
            caplog.clear()
        finally:
            eng.close()


def test_cpu_attention_override_is_sdpa_on_each_query_heads_keys() -> None:
    """The override every CPU base gets (attention_in_cache_dtype) against SDPA on keys and values
    repeated per query head (Hugging Face's repeat_kv): a one-token query with a padding mask."""
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, L, D = 5, 9, 3, 17, 64
    q = torch.randn(B, H, 1, D, generator=g)
    k = torch.randn(B, Hkv, L, D, generator=g)
    v = torch.randn(B, Hkv, L, D, generator=g)
    mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
    for b in range(B):
        mask[b, ..., : 3 * b] = False  # row b: 3b columns of left padding
    rep = lambda x: x.repeat_interleave(H // Hkv, dim=1)  # noqa: E731  [B, H, L, D]
    want = torch.nn.functional.scaled_dot_product_attention(q, rep(k), rep(v), attn_mask=mask, scale=0.3)
    got, _ = precision.attention_in_cache_dtype(torch.nn.Module(), q, k, v, mask, scaling=0.3)
    assert got.shape == (B, 1, H, D)
    assert torch.allclose(got, want.transpose(1, 2), atol=1e-5)


PANELS = pytest.param(
    True,
    id="panels",
    marks=pytest.mark.skipif(
        not (kernels.load() is not None and kernels.load().panels_available()),  # type: ignore[union-attr]
        reason="the panel kernel needs a C++ compiler and a CPU with AVX2 and FMA",
    ),
)
ONEDNN = pytest.param(
    False,
    id="onednn",
    marks=pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="packing needs oneDNN"),
)


def _packing_run(
    dtype: str, packing: bool, monkeypatch: pytest.MonkeyPatch, panels: bool = False
) -> tuple[int, list[object]]:
    """A tiny CPU base in `dtype` with two policies, packed (fp32: in panels or by oneDNN) or not:
    (packed layers, every figure a test compares: a mixed-adapter sample's tokens and log-probs,
    forward log-probs, a PPO loss and its gradients)."""
    monkeypatch.setattr(precision, "panels_apply", lambda: panels)
    if not packing:
        monkeypatch.setattr(precision, "pack_weight", lambda w, bias=None: None)
    monkeypatch.setattr(precision, "FP32_PACK_MIN_ELEMENTS", 0)  # the tiny model's weights are small
    eng = Engine(device="cpu")
    try:
        eng.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype=dtype))
        add_policy(eng, "p", seed=3)
        add_policy(eng, "q", seed=4)
        packed = sum(hasattr(m, "_marft_packed") for m in eng.bases["b"].hf.modules())
        adapters = ["p", "q", "__base__", "q", "p"]
        reqs = [
            SampleRequest(
                adapter=a,
                base="b",
                prompt_ids=s,
                seed=i,
                sampling=SamplingParams(temperature=1.0, max_new_tokens=8, n=2),
            )
            for i, (a, s) in enumerate(zip(adapters, seqs(5, 78), strict=True))
        ]
        out = eng.sample(SampleBatch(requests=reqs))
        figures: list[object] = [[(c.response_ids, c.logprobs) for r in out.results for c in r.completions]]
        data = [Datum(tokens=r.prompt_ids + r.completions[0].response_ids) for r in out.results]
        figures.append([r.logprobs for r in eng.forward(ForwardRequest(adapter="q", data=data)).results])
        fb = eng.forward_backward(
            ForwardBackwardRequest(adapter="p", loss="ppo", data=ppo_data(eng, "p", 5, n=3))
        )
        figures.append(fb.loss)
        figures.append([p.grad.clone() for p in eng.adapters["p"].params if p.grad is not None])
        return packed, figures
    finally:
        eng.close()


@pytest.mark.skipif(not precision.native_bf16(), reason="packing needs a CPU with native bf16")
def test_packed_bf16_weights_change_no_bit_of_sampling_forward_or_training(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bf16 CPU base multiplies by prepacked weights in passes without gradients (sampling with
    mixed adapters, forward) and by the plain ones in training: every result is bit-identical to an
    engine that packs nothing."""
    packed, fig = _packing_run("bfloat16", True, monkeypatch)
    unpacked, ref = _packing_run("bfloat16", False, monkeypatch)
    assert packed == 2 * 7 + 1 and unpacked == 0  # every linear layer of the 2-layer tiny Llama, and its head
    assert fig[:3] == ref[:3]
    grads, ref_grads = fig[3], ref[3]
    assert isinstance(grads, list) and isinstance(ref_grads, list) and len(grads) == len(ref_grads) > 0
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads, strict=True))


@pytest.mark.parametrize("panels", [PANELS, ONEDNN])
def test_packed_fp32_weights_keep_sampling_forward_and_training_within_rounding(
    monkeypatch: pytest.MonkeyPatch, panels: bool
) -> None:
    """An fp32 CPU base multiplies by packed weights (panels or oneDNN's) in passes without
    gradients, whose last bits differ from MKL's plain product: the same sampled tokens, log-probs
    within the parity tolerance, and a PPO loss and gradients (the training pass is plain; its old
    log-probs come from a packed forward) within fp32 rounding of an engine that packs nothing."""
    packed, fig = _packing_run("float32", True, monkeypatch, panels)
    unpacked, ref = _packing_run("float32", False, monkeypatch)
    assert packed == 2 * 7 + 1 and unpacked == 0
    samples, ref_samples = fig[0], ref[0]
    assert isinstance(samples, list) and isinstance(ref_samples, list)
    assert [t for t, _ in samples] == [t for t, _ in ref_samples]
    for (_, lp), (_, ref_lp) in zip(samples, ref_samples, strict=True):
        assert torch.allclose(torch.tensor(lp), torch.tensor(ref_lp), atol=PARITY_TOL)
    for lp, ref_lp in zip(fig[1], ref[1], strict=True):  # type: ignore[call-overload]
        assert torch.allclose(torch.tensor(lp), torch.tensor(ref_lp), atol=PARITY_TOL)
    assert abs(float(fig[2]) - float(ref[2])) < 1e-5  # type: ignore[arg-type]
    grads, ref_grads = fig[3], ref[3]
    assert isinstance(grads, list) and isinstance(ref_grads, list) and len(grads) == len(ref_grads) > 0
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads, ref_grads, strict=True))


def test_pack_weight_for_fp32_and_bf16_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """pack_weight: fp32 CPU weights wherever PyTorch has oneDNN, their packed product within fp32
    rounding of the exact one (float64); bf16 ones only on a CPU with native bf16, their packed
    product equal to F.linear bit for bit. At any row count, for 3-D and strided inputs, with a
    bias. (Panels: `test_panels_...`.)"""
    monkeypatch.setattr(precision, "panels_apply", lambda: False)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 40, generator=g).to(torch.bfloat16)
    bias = torch.randn(48, generator=g)
    xs = [
        torch.randn(1, 40, generator=g),
        torch.randn(33, 40, generator=g),
        torch.randn(2, 7, 40, generator=g),
        torch.randn(5, 3, 40, generator=g)[:, -1],  # a strided [5, 40] view, as Base.last_logits takes
    ]
    if torch.backends.mkldnn.is_available():
        assert precision.pack_weight(torch.randn(48, 40)) is None  # small fp32 weights stay plain
        monkeypatch.setattr(precision, "FP32_PACK_MIN_ELEMENTS", 300 * 576)
        w32, b32 = torch.randn(300, 576, generator=g), torch.randn(300, generator=g)
        packed = precision.pack_weight(w32, b32)
        assert packed is not None and packed.dtype == torch.float32
        for x in [*xs, torch.randn(32, 576, generator=g)]:
            x = x if x.shape[-1] == 576 else torch.randn(*x.shape[:-1], 576, generator=g)
            got = precision.packed_linear(x, packed, b32).double()
            exact = x.double() @ w32.double().T + b32.double()
            # fp32 rounding of a dot product of K terms: about sqrt(K) eps times the sum of their sizes
            # (a product with bf16 inputs or a wrong weight misses by orders of magnitude more)
            bound = 2 * 576**0.5 * torch.finfo(torch.float32).eps * (x.double().abs() @ w32.double().abs().T)
            assert got.shape == exact.shape and bool(((got - exact).abs() <= bound).all())
    else:
        assert precision.pack_weight(w.float()) is None
    if precision.native_bf16():
        packed = precision.pack_weight(w)
        assert packed is not None and packed.dtype == torch.bfloat16
        for x in xs:
            xb = x.to(torch.bfloat16)
            assert torch.equal(precision.packed_linear(x, packed, None), F.linear(xb, w))
            assert torch.equal(
                precision.packed_linear(x, packed, bias.to(torch.bfloat16)),
                F.linear(xb, w, bias.to(torch.bfloat16)),
            )
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    assert precision.pack_weight(w) is None


@pytest.mark.parametrize("panels", [PANELS, ONEDNN])
def test_packed_fp32_layer_takes_the_packed_product_only_without_gradients_on_few_rows(
    monkeypatch: pytest.MonkeyPatch, panels: bool
) -> None:
    """A packed fp32 layer multiplies by its packed copy in a pass without gradients on at most
    PANEL_MAX_ROWS (panels) or FP32_PACKED_MAX_ROWS (oneDNN) rows, and by the plain weight (MKL's
    product, bit for bit) on more rows or with gradients. Which product ran is recorded, not read from
    the bits: on some CPU the two may agree."""
    monkeypatch.setattr(precision, "panels_apply", lambda: panels)
    g = torch.Generator().manual_seed(1)
    layer = torch.nn.Linear(576, 1024)  # 589,824 elements: packed either way
    model = torch.nn.Sequential(layer).requires_grad_(False)
    assert precision.pack_linear_weights(model) == 1  # type: ignore[arg-type]
    assert isinstance(layer._marft_packed, precision.Panels) == panels
    packed_rows: list[int] = []
    product = precision.packed_linear

    def recorded(x: torch.Tensor, w: precision.Packed, bias: torch.Tensor | None) -> torch.Tensor:
        packed_rows.append(x.numel() // x.shape[-1])
        return product(x, w, bias)

    monkeypatch.setattr(precision, "packed_linear", recorded)
    most = precision.PANEL_MAX_ROWS if panels else precision.FP32_PACKED_MAX_ROWS
    few = torch.randn(2, 4, 576, generator=g)
    at_most = torch.randn(most, 576, generator=g)
    many = torch.randn(most + 1, 576, generator=g)
    with torch.no_grad():
        assert torch.equal(layer(few), product(few, layer._marft_packed, layer.bias))
        assert torch.equal(layer(at_most), product(at_most, layer._marft_packed, layer.bias))
        assert packed_rows == [8, most]
        assert torch.equal(layer(many), F.linear(many, layer.weight, layer.bias))
    x = few.clone().requires_grad_(True)
    y = layer(x)
    assert y.requires_grad and torch.equal(y.detach(), F.linear(few, layer.weight, layer.bias))
    assert packed_rows == [8, most]  # neither the many rows nor the pass with gradients took it


@pytest.mark.parametrize("panels", [PANELS])
def test_panels_multiply_any_shape_within_fp32_rounding_and_each_row_alone(
    monkeypatch: pytest.MonkeyPatch, panels: bool
) -> None:
    """The panel kernel (csrc/panel_linear.cpp), through pack_weight and packed_linear: within fp32
    rounding of the exact product (float64) for every block of rows it takes (1 to 6, the 4 + 3 and
    4 + 4 endings) and beyond, shallow products (K <= 64, split by rows rather than panels), output
    columns that fill no whole panel, 3-D and strided inputs, with
    a bias; and every row's result is bit for bit the one it gets alone, whatever the other rows."""
    monkeypatch.setattr(precision, "panels_apply", lambda: panels)
    g = torch.Generator().manual_seed(2)
    for n, k in [(70, 33), (16, 576), (5, 64), (1536, 64)]:
        w, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        packed = precision.pack_weight(w, bias)
        assert isinstance(packed, precision.Panels) and packed.n == n
        for rows in [1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 64, 131]:
            x = torch.randn(rows, k, generator=g)
            got = precision.packed_linear(x, packed, bias)
            exact = x.double() @ w.double().T + bias.double()
            # fp32 rounding of a dot product of K terms: about sqrt(K) eps times the sum of their sizes
            bound = 2 * k**0.5 * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T + 1)
            assert got.dtype == torch.float32 and got.shape == exact.shape
            assert bool(((got.double() - exact).abs() <= bound).all()), (n, k, rows)
            for i in (0, rows // 2, rows - 1):
                assert torch.equal(precision.packed_linear(x[i : i + 1], packed, bias)[0], got[i])
        x3 = torch.randn(2, 7, k, generator=g)
        strided = torch.randn(5, 3, k, generator=g)[:, -1]  # [5, k] with row stride 3 k
        for x in (x3, strided):
            assert torch.equal(
                precision.packed_linear(x, packed, None),
                precision.packed_linear(x.contiguous().view(-1, k), packed, None).view(*x.shape[:-1], n),
            )


@pytest.mark.skipif(not precision.bf16_panels_apply(), reason="no bf16 panels on this CPU")
def test_bf16_panels_multiply_any_shape_within_fp32_rounding_and_each_row_alone() -> None:
    """The bf16 panel kernel (csrc/panel_linear.cpp): x and w rounded to bf16 as PyTorch rounds them,
    the sums within fp32 rounding of the exact product (float64) of those, for every block of rows
    (1 to 6, the 4 + 3 and 4 + 4 endings) and beyond, odd K, output columns that fill no whole panel;
    and every row's result bit for bit the one it gets alone."""
    k = kernels.load()
    assert k is not None
    g = torch.Generator().manual_seed(3)
    for n, d in [(70, 33), (32, 576), (5, 64), (1536, 65), (1, 1)]:
        w = torch.randn(n, d, generator=g)
        panels = k.pack_panels_bf16(w.to(torch.bfloat16))
        assert torch.equal(panels, k.pack_panels_bf16(w))  # fp32 weights are rounded as PyTorch does
        for rows in [1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 64, 131]:
            x = torch.randn(rows, d, generator=g)
            got = k.panel_linear_bf16(x, panels, n)
            xb, wb = x.to(torch.bfloat16).double(), w.to(torch.bfloat16).double()
            exact = xb @ wb.T
            bound = 2 * d**0.5 * torch.finfo(torch.float32).eps * (xb.abs() @ wb.abs().T + 1e-30)
            assert got.dtype == torch.float32 and got.shape == exact.shape
            assert bool(((got.double() - exact).abs() <= bound).all()), (n, d, rows)
            for i in (0, rows // 2, rows - 1):
                assert torch.equal(k.panel_linear_bf16(x[i : i + 1], panels, n)[0], got[i])
    with pytest.raises(RuntimeError, match="pack_panels_bf16's"):
        k.panel_linear_bf16(torch.randn(2, 8), k.pack_panels_bf16(torch.randn(4, 6)), 4)


def test_explicit_attention_equals_sdpa_in_values_and_gradients() -> None:
    """explicit_attention (bf16 training passes on a CPU) against SDPA on per-head copies of the keys
    and values, in float64: causal without a mask (also with cached columns before the queries), and
    a padding mask; every query head group reads its own key/value head."""
    g = torch.Generator().manual_seed(0)
    B, H, Hk, D = 2, 6, 2, 8
    for T, L, padded in [(5, 5, False), (3, 7, False), (6, 6, True), (6, 6, "left")]:
        q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64, requires_grad=True)
        k = torch.randn(B, Hk, L, D, generator=g, dtype=torch.float64, requires_grad=True)
        v = torch.randn(B, Hk, L, D, generator=g, dtype=torch.float64, requires_grad=True)
        keep = torch.ones(T, L, dtype=torch.bool).tril(L - T).expand(B, 1, T, L).clone()
        if padded == "left":
            # row 1's first two positions are padding: their queries have no key to attend at all
            keep[1, :, :, :2] = False
        elif padded:
            keep[1, :, :, 4:] = False  # row 1: its last two positions are padding (right-padded)
        mask = keep if padded else None
        got = precision.explicit_attention(q, k, v, mask, None)
        want = F.scaled_dot_product_attention(
            q, k.repeat_interleave(H // Hk, 1), v.repeat_interleave(H // Hk, 1), attn_mask=keep
        )
        assert got.dtype == torch.float32 and got.shape == (B, H, T, D)
        w = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
        if padded == "left":  # a query with no key: finite (the mean of the values), and ignored
            assert torch.isfinite(got).all()
            assert torch.allclose(
                got[1, :, :2].double(), v[1].mean(-2).repeat_interleave(H // Hk, 0)[:, None]
            )
            want = torch.where(keep.any(-1, keepdim=True), want, got.detach().double())  # SDPA: NaN
            w[1, :, :2] = 0.0  # as the loss weights padding
        assert torch.allclose(got.double(), want, atol=1e-5), (T, L, padded)
        grads = torch.autograd.grad((got.double() * w).sum(), [q, k, v])
        want_grads = torch.autograd.grad((want * w).sum(), [q, k, v])
        for a, b in zip(grads, want_grads, strict=True):
            assert torch.allclose(a, b, atol=1e-4), (T, L, padded)


def test_a_gpu_base_stores_its_parameters_in_bf16_and_keeps_its_rotary_frequencies() -> None:
    """What `place` does on a GPU (`store_parameters`, here on the CPU): every parameter in bf16, the
    tied embedding and head still one tensor, and the rotary inverse frequencies (a buffer) still fp32,
    as computed: in bf16 they would be off by up to 2^-9 relative, an angle error that grows with the
    position."""
    model, _ = load_source("tiny:llama", 0)
    inv = {n: b.clone() for n, b in model.named_buffers() if n.endswith("inv_freq")}
    assert inv and all(b.dtype == torch.float32 for b in inv.values())
    precision.store_parameters(model, torch.device("cpu"), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    if model.config.tie_word_embeddings:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    for n, b in model.named_buffers():
        if n in inv:
            assert b.dtype == torch.float32 and torch.equal(b, inv[n]), n
