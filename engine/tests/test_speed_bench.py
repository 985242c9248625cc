"""bench/speed_bench.py runs end to end on a tiny model: decode (timed without its prefill) and the
short-answer comparison write positive, finite figures, a bad --only is refused by name, and every
kernel the matmul probe times computes the product; the in-process A/B scripts (packing_ab.py,
train_ab.py) run and check what they assert."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marft_engine import precision

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "speed_bench.py", "--source", "tiny:llama", "--quick", "--reps", "1", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=BENCH, env=env, capture_output=True, text=True)


def test_speed_bench_decode_and_short_answers_on_a_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    r = run(tmp_path, "--only=decode,short", "--dtypes=float32", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in [
        "decode_roofline_fraction",
        "decode_sampling_flops_fraction_float32",
        "decode_step_ms_float32",
        "decode_prefill_s_float32",
        "decode_linears_ms_matmul_float32",
        "decode_lora4_step_ms_float32",
        "decode_probe_bandwidth_float32",
        "decode_bandwidth_fraction_float32",
        "decode_roofline_min_fraction_float32",
        "engine_vs_generate_short",
        "engine_vs_generate_short_no_reuse",
        "engine_vs_generate_short_flops_bound",
    ]:
        assert isinstance(res[key], float) and math.isfinite(res[key]) and res[key] > 0, key
    # the roofline proper is the lower of the two limits, so its fraction is the higher one
    assert res["decode_roofline_min_fraction_float32"] == max(
        res["decode_roofline_fraction_float32"], res["decode_bandwidth_fraction_float32"]
    )
    # at batch 32 the memory limit is 32 steps' rows per the time to read a step's bytes
    want = 32 * res["decode_probe_bandwidth_float32"] / res["decode_step_bytes_float32"]
    assert math.isclose(res["decode_bandwidth_limit_tokens_per_s_float32"], want, rel_tol=1e-9)
    # generate pads every prompt to the longest and runs every row to the longest answer
    assert res["engine_vs_generate_short_flops_bound"] > 1
    assert "train_flops_fraction" not in res  # --only left the training section out


def test_speed_bench_names_an_unknown_part(tmp_path: Path) -> None:
    r = run(tmp_path, "--only=decode,nope", "--out", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "--only: nope not one of decode, train, prefix, short" in r.stderr


def test_every_probe_kernel_computes_the_product() -> None:
    """The probe times the fastest of its kernels: each must compute a @ b.T (a rectangular case, so a
    transposed or mis-packed weight shows), in fp32 and bf16."""
    sys.path.insert(0, str(BENCH))
    try:
        import torch
        from probe import gemm_kernels
    finally:
        sys.path.remove(str(BENCH))
    torch.manual_seed(0)
    for dtype, tol in [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)]:
        a = torch.randn(32, 576).to(dtype)
        b = torch.randn(192, 576).to(dtype)
        want = a.double() @ b.double().T
        kernels = gemm_kernels(a, b)
        assert "matmul" in kernels
        for name, fn in kernels.items():
            got = fn()
            assert got.shape == (32, 192), name
            assert torch.allclose(got.double(), want, rtol=tol, atol=tol * 24), (name, dtype)


def run_ab(tmp_path: Path, script: str, *args: str) -> dict[str, float]:
    """The figures an in-process A/B script of bench/ writes for one round on the tiny model."""
    out = tmp_path / "ab.json"
    cmd = [sys.executable, script, "--source", "tiny:llama", "--reps", "1", *args, "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=BENCH, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="packing needs oneDNN")
def test_packing_ab_on_a_tiny_model(tmp_path: Path) -> None:
    """bench/packing_ab.py: in bf16 both engines sample the same tokens (it asserts so), in fp32 nearly
    all; every figure is a positive time or ratio, for each dtype this CPU packs and each batch."""
    res = run_ab(tmp_path, "packing_ab.py", "--batches", "4,2")
    dtypes = ["float32", "bfloat16"] if precision.native_bf16() else ["float32"]
    assert {k.split("_b")[0] for k in res} == set(dtypes)
    for dtype in dtypes:
        for batch in (4, 2):
            for label in ("base", "lora4"):
                key = f"{dtype}_b{batch}_{label}"
                for fig in ("packed_step_ms", "plain_step_ms", "packing_speedup"):
                    assert math.isfinite(res[f"{key}_{fig}"]) and res[f"{key}_{fig}"] > 0, (key, fig)
                assert res[f"{key}_tokens_same"] >= (1.0 if dtype == "bfloat16" else 0.9), key


@pytest.mark.skipif(not precision.panels_apply(), reason="the engine packs no panels on this CPU")
def test_panels_ab_on_a_tiny_model(tmp_path: Path) -> None:
    """bench/panels_ab.py: every figure at each shape is a positive time or ratio."""
    res = run_ab(tmp_path, "panels_ab.py", "--shapes", "4x1,2x2", "--tokens", "16")
    assert len(res) == 6
    assert all(math.isfinite(v) and v > 0 for v in res.values())
    assert {k.rsplit("_ctx", 1)[0] for k in res} == {"float32_b4", "float32_b2"}


@pytest.mark.skipif(
    not (precision.panels_apply() or precision.bf16_panels_apply()), reason="no panels on this CPU"
)
def test_fused_ab_on_a_tiny_model(tmp_path: Path) -> None:
    """bench/fused_ab.py: for each dtype the fused step has panels for here, its fused side took the
    fused layer (it exits otherwise), and every figure at each shape is a positive time or ratio."""
    res = run_ab(tmp_path, "fused_ab.py", "--shapes", "4x1,2x2", "--tokens", "16")
    dtypes = [
        d
        for d, on in (("float32", precision.panels_apply()), ("bfloat16", precision.bf16_panels_apply()))
        if on and (d == "float32" or precision.native_bf16())
    ]
    for dtype in dtypes:
        assert res.pop(f"{dtype}_fused_steps") >= 2 * 16 / 2  # half the 16 decode steps of each shape
    assert len(res) == 6 * len(dtypes)
    assert all(math.isfinite(v) and v > 0 for v in res.values())
    assert {k.rsplit("_ctx", 1)[0] for k in res} == {f"{d}_b{b}" for d in dtypes for b in (4, 2)}


def test_train_ab_on_a_tiny_model(tmp_path: Path) -> None:
    """bench/train_ab.py: the previous and the shipped training forward give the same bits (it asserts
    so) and every figure is a positive time or ratio, in fp32 and bf16."""
    res = run_ab(tmp_path, "train_ab.py")
    keys = {
        f"{dtype}_{label}_{fig}"
        for dtype in ("float32", "bfloat16")
        for label in ("forward_backward", "forward")
        for fig in ("previous_s", "new_s", "speedup")
    }
    assert set(res) == keys
    assert all(math.isfinite(v) and v > 0 for v in res.values())


def test_drafts_ab_on_a_tiny_model(tmp_path: Path) -> None:
    """bench/drafts_ab.py: every figure at each batch, rates positive, acceptance a fraction and a
    row's tokens per step at least one."""
    res = run_ab(tmp_path, "drafts_ab.py", "--batches", "2,1", "--dtypes", "float32")
    for b in (2, 1):
        key = f"float32_b{b}"
        for fig in ("speedup", "tokens_per_s_none", "tokens_per_s_drafts"):
            assert math.isfinite(res[f"{key}_{fig}"]) and res[f"{key}_{fig}"] > 0, (key, fig)
        assert 0 <= res[f"{key}_acceptance"] <= 1
        assert res[f"{key}_tokens_per_step"] >= 1
    assert len(res) == 10


@pytest.mark.skipif(
    not (precision.panels_apply() or precision.bf16_panels_apply()), reason="no panels on this CPU"
)
def test_prefill_ab_on_a_tiny_model(tmp_path: Path) -> None:
    """bench/prefill_ab.py: for each dtype the fused prefill has panels for here, its fused side was
    fused (it exits otherwise), and every figure at each shape is a positive time or ratio."""
    res = run_ab(tmp_path, "prefill_ab.py", "--shapes", "1x1,3x2")
    dtypes = [
        d
        for d, on in (("float32", precision.panels_apply()), ("bfloat16", precision.bf16_panels_apply()))
        if on and (d == "float32" or precision.native_bf16())
    ]
    for dtype in dtypes:
        assert res.pop(f"{dtype}_fused_prefills") == 2 * 2  # each shape's warm-up and its 1 fused call
        assert 0 <= res.pop(f"{dtype}_max_first_logprob_gap") < 0.5
    assert len(res) == 6 * len(dtypes)
    assert all(math.isfinite(v) and v > 0 for v in res.values())
    assert {k.split("_tokens")[0] for k in res} == {f"{d}_p{n}" for d in dtypes for n in (1, 3)}
