"""Helpers shared by the engine tests."""

from __future__ import annotations

import torch

from marft_engine import lora_batch
from marft_engine.engine import Engine
from marft_engine.schemas import (
    AdapterCreate,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    LoraConfig,
    OptimizerConfig,
    OptimStepRequest,
)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def perturb(engine: Engine, name: str, seed: int, scale: float = 0.5) -> None:
    """LoRA B starts at zero (adapter == base); give it random weights so adapters really differ."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in engine.adapters[name].params:
            p.add_(torch.randn(p.shape, generator=g) * scale)
    lora_batch.bump()  # weights changed behind the engine's back


def add_policy(engine: Engine, name: str, base: str = "b", seed: int = 0, lr: float = 1e-2) -> None:
    engine.create_adapter(
        AdapterCreate(
            name=name,
            base=base,
            lora=LoraConfig(r=4, alpha=8, target_modules=TARGETS),
            optimizer=OptimizerConfig(lr=lr),
            seed=seed,
        )
    )
    perturb(engine, name, 1000 + seed)


def applied(monkeypatch: object, module: object, name: str) -> list[bool]:
    """Wrap module.name, a function that returns None where it does not apply: the list it returns
    records, call by call, whether it applied (monkeypatch: pytest's, which undoes the wrap)."""
    calls: list[bool] = []
    fn = getattr(module, name)

    def wrapped(*a: object, **k: object) -> object:
        out = fn(*a, **k)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(module, name, wrapped)  # type: ignore[attr-defined]
    return calls


PARITY_TOL = 1e-4  # CPU fp32: sample (KV cache, left padding) vs forward (full sequence, right padding)


def seqs(n: int, seed: int, lo: int = 5, hi: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi, (1,), generator=g))
        out.append(torch.randint(0, 256, (length,), generator=g).tolist())
    return out


def ppo_data(engine: Engine, adapter: str, seed: int, n: int = 6) -> list[Datum]:
    data = [Datum(tokens=s) for s in seqs(n, seed)]
    old = engine.forward(ForwardRequest(adapter=adapter, data=data)).results
    g = torch.Generator().manual_seed(seed + 1)
    return [
        Datum(
            tokens=d.tokens,
            weights=[0.0] + [1.0] * (len(d.tokens) - 1),
            old_logprobs=[x + 0.3 * float(torch.randn(1, generator=g)) for x in r.logprobs],
            advantages=torch.randn(len(d.tokens), generator=g).tolist(),
        )
        for d, r in zip(data, old, strict=True)
    ]


def snapshot(engine: Engine) -> dict[str, torch.Tensor]:
    """Every tensor the engine holds: base, all LoRA weights, value heads."""
    out = {n: p.detach().clone() for n, p in engine.bases["b"].hf.named_parameters()}
    for name, a in engine.adapters.items():
        if a.value_head is not None:
            out.update({f"{name}.head.{k}": v.clone() for k, v in a.value_head.state_dict().items()})
    return out


def train_steps(engine: Engine, adapter: str, seed: int, steps: int) -> list[float]:
    for k in range(steps):
        data = ppo_data(engine, adapter, seed + k, n=3)
        engine.forward_backward(ForwardBackwardRequest(adapter=adapter, loss="ppo", data=data))
        engine.optim_step(OptimStepRequest(adapter=adapter))
    probe = [Datum(tokens=s) for s in seqs(2, 999)]
    res = engine.forward(ForwardRequest(adapter=adapter, data=probe)).results
    return [x for r in res for x in r.logprobs]
