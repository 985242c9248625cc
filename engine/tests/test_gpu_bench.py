"""bench/gpu_bench.py, prepared for a GPU that no session has had yet, runs end to end on the CPU with
a tiny model: every figure it writes is a positive, finite number."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_gpu_bench_runs_on_cpu_with_a_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    cmd = [
        sys.executable,
        "gpu_bench.py",
        "--device",
        "cpu",
        "--source",
        "tiny:llama",
        "--quick",
        "--out",
        str(out),
    ]
    r = subprocess.run(
        cmd, cwd=BENCH, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in [
        "probe_flops",
        "probe_bandwidth",
        "engine_tokens_per_s",
        "generate_tokens_per_s",
        "engine_vs_generate_ratio",
        "decode_roofline_fraction",
        "train_tokens_per_s",
        "train_mfu_vs_probe",
        "mixed_adapter_train_speedup",
        "mixed_adapter_train_speedup_runs",
    ]:
        assert isinstance(res[key], float) and math.isfinite(res[key]) and res[key] > 0, key
