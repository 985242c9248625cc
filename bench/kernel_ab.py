"""The engine's C++ kernels (engine/marft_engine/csrc) as the working tree has them against the same
kernels at an earlier commit, in one process: both builds multiply the same weights and attend over
the same caches (shared tensors, so memory placement is the same), alternating rep by rep. Per
build, a decode step's 30 layers of SmolLM2-135M shapes (fp32, random weights, each layer's own so
each is read from memory): their 210 products alone on panels, and the 30 fused decoder layers
(`DecodeLayer`, no LoRA) with attention over the cache. On a CPU with AVX2 and FMA.

    .venv/bin/python bench/kernel_ab.py --base f5e4a22 [--rows 1,4,8,20,32] [--context 300]
        [--spread] [--reps 12] [--threads 2] [--out F.json]

--context: cache columns each row attends; --spread: rows start at columns spread over the first
context - 100 (rows that joined a batch with contexts of different lengths), the rest masked.
Builds are cached under the model cache (kernel_ab/), a minute or two each on first use.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import subprocess
import time
from pathlib import Path
from types import ModuleType

import torch
from marft_engine.kernels import CFLAGS, SOURCES
from marft_engine.models import cache_root
from probe import write_figures

CSRC = SOURCES[0].parent
REPO = CSRC.parents[2]
# q, k, v, o, gate, up, down of SmolLM2-135M: (d_out, d_in)
SHAPES = [
    (576, 576),
    (192, 576),
    (192, 576),
    (576, 576),
    (1536, 576),
    (1536, 576),
    (576, 1536),
]
D, H, HK, LAYERS = 64, 9, 3, 30
NONE = torch.empty(0)  # a Proj's bias, LoRA stacks and slots: none


def sources_at(rev: str | None) -> dict[str, str]:
    """The csrc files' text at git revision rev, or in the working tree (None)."""
    if rev is None:
        return {
            p.name: p.read_text()
            for p in sorted(CSRC.iterdir())
            if p.suffix in (".cpp", ".h")
        }
    rel = CSRC.relative_to(REPO).as_posix()
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, f"{rel}/"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {
        Path(n).name: subprocess.run(
            ["git", "show", f"{rev}:{n}"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for n in names
        if n.endswith((".cpp", ".h"))
    }


def build(files: dict[str, str], tag: str) -> ModuleType:
    """One build of the kernels, its pybind classes local to it (two builds in one process would
    otherwise both register `Proj` and `DecodeLayer`)."""
    from torch.utils import cpp_extension

    files = {
        n: re.sub(
            r'pybind11::class_<(\w+)>\(m, "(\w+)"',
            r'pybind11::class_<\1>(m, "\2", pybind11::module_local()',
            t,
        )
        for n, t in files.items()
    }
    h = hashlib.sha256(
        "".join(n + t for n, t in sorted(files.items())).encode()
        + " ".join(CFLAGS).encode()
    )
    name = f"kernel_ab_{tag}_{h.hexdigest()[:12]}"
    folder = cache_root() / "kernel_ab" / name
    (folder / "src").mkdir(parents=True, exist_ok=True)
    for n, t in files.items():
        (folder / "src" / n).write_text(t)
    print(f"kernel_ab: building {tag} (cached after the first time)", flush=True)
    return cpp_extension.load(
        name=name,
        sources=[str(folder / "src" / n) for n in sorted(files) if n.endswith(".cpp")],
        extra_cflags=CFLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--base", required=True, help="git revision whose kernels are the baseline"
    )
    ap.add_argument("--rows", default="1,4,8,20,32")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--spread", action="store_true")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mods = {
        "new": build(sources_at(None), "new"),
        "base": build(sources_at(args.base), "base"),
    }
    if not all(m.panels_available() for m in mods.values()):
        raise SystemExit("kernel_ab: the panel kernel needs AVX2 and FMA")
    g = torch.Generator().manual_seed(0)
    weights = [
        [torch.randn(n, k, generator=g) * 0.02 for n, k in SHAPES]
        for _ in range(LAYERS)
    ]
    panels = [
        [mods["new"].pack_panels(w) for w in layer] for layer in weights
    ]  # the same layout in both
    res: dict[str, float] = {}
    for M in [int(r) for r in args.rows.split(",")]:
        xs = {k: torch.randn(M, k, generator=g) for k in (576, 1536)}
        layers = {
            tag: [
                mod.DecodeLayer(
                    torch.ones(576),
                    torch.ones(576),
                    1e-5,
                    [
                        mod.Proj(p, k, n, NONE, NONE, 0, NONE, 0, NONE)
                        for (n, k), p in zip(SHAPES, layer, strict=True)
                    ],
                    D,
                    D**-0.5,
                )
                for layer in panels
            ]
            for tag, mod in mods.items()
        }
        C = args.context
        kb = [torch.randn(M, HK, C + 64, D, generator=g) for _ in range(LAYERS)]
        vb = [torch.randn(M, HK, C + 64, D, generator=g) for _ in range(LAYERS)]
        keep = torch.ones(M, C + 1, dtype=torch.bool)
        if args.spread:
            for i in range(M):
                keep[i, : int(torch.randint(0, max(1, C - 100), (1,), generator=g))] = (
                    False
                )
        cos, sin, x = (
            torch.randn(M, D, generator=g),
            torch.randn(M, D, generator=g),
            torch.randn(M, 576, generator=g),
        )
        prod: dict[str, list[float]] = {t: [] for t in mods}
        full: dict[str, list[float]] = {t: [] for t in mods}
        for rep in range(args.reps + 2):  # the first two of each: warm-up
            for tag in ("new", "base") if rep % 2 else ("base", "new"):
                mod = mods[tag]
                t = time.perf_counter()
                for layer in panels:
                    for (n, k), p in zip(SHAPES, layer, strict=True):
                        mod.panel_linear(xs[k], p, n)
                dt = time.perf_counter() - t
                t = time.perf_counter()
                for layer, kl, vl in zip(layers[tag], kb, vb, strict=True):
                    layer.forward(x, cos, sin, kl, vl, 0, C, keep)
                if rep >= 2:
                    prod[tag].append(dt)
                    full[tag].append(time.perf_counter() - t)
        for what, ts in (("products", prod), ("layers", full)):
            base, new = (1e3 * statistics.median(ts[t]) for t in ("base", "new"))
            ratio = statistics.median(
                b / n for b, n in zip(ts["base"], ts["new"], strict=True)
            )
            res |= {
                f"rows{M}_{what}_base_ms": base,
                f"rows{M}_{what}_new_ms": new,
                f"rows{M}_{what}_speedup": ratio,
            }
            print(
                f"{M:3d} rows, 30 layers, {what:8s}: base {base:6.1f} ms, new {new:6.1f} ms, paired {ratio:.2f}x",
                flush=True,
            )
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
