"""The training pass's lighter LoRA forward and explicit attention against the previous ones, in one
process: one engine, the two variants swapped in turn around `forward_backward` (PPO on 8 rows of
the demo's shapes, one adapter with LoRA r16 on every projection) and `forward` (the same rows, no
gradients). Alternating within one process keeps both sides under the same load: on a shared
machine the speed drifts more between processes than the effect.

The previous variant is PEFT's own LoRA forward (the scaling on the layer's output, a bf16 input
cast to fp32 first) and the previous explicit attention (the scale on the scores, a masked fill of
a mask copied per query head), kept here as `previous_explicit_attention`. With alpha = 2 r both
give the same bits, which this script asserts: the loss, every gradient and every forward value.

    .venv/bin/python bench/train_ab.py [--reps 7] [--dtypes float32,bfloat16]
        [--source pkg:smollm2-135m-instruct] [--out F.json]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
from marft_engine import lora_batch, precision
from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate, ForwardBackwardRequest, ForwardRequest
from probe import ab_arguments, demo_data, paired_figures, write_figures
from speed_bench import SMOL, add_adapters


def previous_explicit_attention(
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, H_kv, L, D]
    value: torch.Tensor,  # [B, H_kv, L, D]
    attention_mask: torch.Tensor
    | None,  # [B, 1, T, L] bool, True = attend; None = causal
    scaling: float | None,
) -> torch.Tensor:
    """precision.explicit_attention before commit "train: lighter LoRA forward": [B, H, T, D] fp32."""
    B, H, T, D = query.shape
    Hk, L = key.shape[1], key.shape[2]
    g = H // Hk
    with torch.autocast(query.device.type, enabled=False):
        q = query.float().reshape(B, Hk, g * T, D)
        scores = (q @ key.float().transpose(-1, -2)) * (
            D**-0.5 if scaling is None else scaling
        )
        if attention_mask is None:
            keep = torch.ones(T, L, dtype=torch.bool, device=query.device).tril(L - T)
        else:
            keep = attention_mask
        keep = (
            keep.unsqueeze(-3)
            .expand(*keep.shape[:-2], g, T, L)
            .reshape(*keep.shape[:-2], g * T, L)
        )
        scores = scores.masked_fill(~keep, torch.finfo(torch.float32).min)
        out = scores.softmax(-1) @ value.float()
    return out.reshape(B, H, T, D)


@contextlib.contextmanager
def previous() -> Iterator[None]:
    """Within the block, the engine runs PEFT's LoRA forward and the previous explicit attention."""
    active, attention = lora_batch._active_forward, precision.explicit_attention
    lora_batch._active_forward = lambda self, x: lora_batch._original_forward(self, x)  # type: ignore[assignment]
    precision.explicit_attention = previous_explicit_attention
    try:
        yield
    finally:
        lora_batch._active_forward, precision.explicit_attention = active, attention


def compare(dtype: str, source: str, reps: int) -> dict[str, float]:
    eng = Engine(device="cpu", max_batch=64)
    eng.create_base(BaseCreate(name="s", source=source, dtype=dtype))
    (name,) = add_adapters(eng, "s", "t", 1)
    data = demo_data(eng.bases["s"].vocab_size, 8, 10)
    params = eng.adapters[name].params

    def fb() -> tuple[float, list[torch.Tensor]]:
        """(seconds, [loss, every gradient])"""
        t = time.perf_counter()
        out = eng.forward_backward(
            ForwardBackwardRequest(adapter=name, loss="ppo", data=data)
        )
        dt = time.perf_counter() - t

        def take() -> list[torch.Tensor]:
            g = [torch.tensor(out.loss)] + [
                p.grad.clone() for p in params if p.grad is not None
            ]
            for p in params:
                p.grad = None
            return g

        return dt, eng.compute.call(take)

    def fwd() -> tuple[float, list[torch.Tensor]]:
        """(seconds, [each row's log-probs])"""
        t = time.perf_counter()
        out = eng.forward(ForwardRequest(adapter=name, data=data))
        return time.perf_counter() - t, [
            torch.tensor(r.logprobs or []) for r in out.results
        ]

    res: dict[str, float] = {}
    for label, run in (("forward_backward", fb), ("forward", fwd)):
        old: list[float] = []
        new: list[float] = []
        for _ in range(reps + 1):  # the first round warms up
            with previous():
                a, bits_a = run()
            b, bits_b = run()
            assert len(bits_a) == len(bits_b) > 1 and all(
                torch.equal(x, y) for x, y in zip(bits_a, bits_b, strict=True)
            ), f"{dtype} {label}: the two variants gave different bits"
            old.append(a)
            new.append(b)
        res |= paired_figures(dtype, label, ("previous", "new"), old, new)
    eng.close()
    return res


def main() -> None:
    args = ab_arguments(__doc__ or "", SMOL).parse_args()
    torch.set_num_threads(1)
    res: dict[str, float] = {}
    for dtype in args.dtypes.split(","):
        res |= {
            f"{dtype}_{k}": v for k, v in compare(dtype, args.source, args.reps).items()
        }
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
