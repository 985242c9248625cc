"""The engine's CPU kernels (csrc/): one C++ extension, compiled once for this CPU and cached.

- `decode_attention`: a decode step's attention over the KV cache (decode_attention.py).
- `pack_panels` / `panel_linear`: fp32 products of a few rows by a weight laid out once in panels of
  16 output columns (precision.py), where the CPU has AVX2 and FMA (`panels_available`).
- `pack_panels_bf16` / `panel_linear_bf16`: the same for bf16 weights, in panels of 32 output columns
  of input pairs, by `vdpbf16ps` (bf16 products, fp32 sums), where the CPU has AVX512_BF16
  (`panels_bf16_available`).
- `DecodeLayer` / `Proj`: a whole Llama-shaped decoder layer of a decode step on those panels (fp32 or bf16)
  (fused_decode.py); its RMS norm and SiLU-gated MLP middle are also bound as `rms_norm` and
  `silu_mul`, for their tests.

The extension is compiled for this CPU (`-march=native`) by `torch.utils.cpp_extension` into the model
cache (`make setup` builds it, tens of seconds; a cache hit costs about a second). Where it cannot be
built (no C++ compiler), `load` returns None and the engine keeps PyTorch's own operations. Only
module.cpp and decode_layer.cpp, which bind to Python, include `torch/extension.h` (pybind and all of
torch's API): parsing it took most of each file's build, so the others include ATen's own headers.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from types import ModuleType

import torch

from .models import cache_root

log = logging.getLogger("marft.engine")

SOURCES = sorted((Path(__file__).with_name("csrc")).glob("*.cpp"))
HEADERS = sorted((Path(__file__).with_name("csrc")).glob("*.h"))
# -ffast-math: vectorized reductions and exp (the attention kernel keeps every value finite, as that
# assumes). -fopenmp: at::parallel_for is inlined here and splits the work over torch's threads with
# OpenMP (without it, one thread).
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]

_lock = threading.Lock()
_built: list[ModuleType | None] = []  # [] until the first try; then [module] or [None] (failed)


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo; empty where there is none (not Linux)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _name() -> str:
    """The extension's name: the sources, the flags, torch and this CPU (-march=native) in a hash, so
    a cached build never runs on a CPU or torch it was not built for."""
    h = hashlib.sha256()
    for source in SOURCES + HEADERS:
        h.update(source.name.encode() + source.read_bytes())
    h.update(" ".join([*CFLAGS, torch.__version__, *sorted(cpu_flags())]).encode())
    return f"marft_kernels_{h.hexdigest()[:16]}"


def load() -> ModuleType | None:
    """The compiled extension, built on first use (tens of seconds) or loaded from the cache; None
    where it cannot be built (logged once)."""
    if _built:  # every decode step's every layer asks: no lock once settled
        return _built[0]
    with _lock:
        if not _built:
            from torch.utils import cpp_extension  # imported when first needed: it is slow to import

            name = _name()
            folder = cache_root() / "torch_extensions" / name
            try:
                folder.mkdir(parents=True, exist_ok=True)
                mod = cpp_extension.load(
                    name=name,
                    sources=[str(s) for s in SOURCES],
                    extra_cflags=CFLAGS,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(folder),
                    verbose=False,
                )
                _built.append(mod)
            except Exception as e:  # no compiler, no ninja, a failed build: PyTorch's operations instead
                log.warning("CPU kernels unavailable, decoding with PyTorch's operations: %s", e)
                _built.append(None)
        return _built[0]
