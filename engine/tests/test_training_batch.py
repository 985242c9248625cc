"""forward_backward over several adapters in shared passes (training_batch.py): each adapter's
gradients, loss and stats equal those of its own separate calls; isolation still holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import add_policy, perturb, ppo_data, snapshot

from marft_engine import lora_batch, training, training_batch
from marft_engine.engine import Engine
from marft_engine.errors import EngineError
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    Datum,
    ForwardBackwardBatch,
    ForwardBackwardRequest,
    LoraConfig,
    OptimStepRequest,
    PPOConfig,
    ValueConfig,
)


def grads(engine: Engine) -> dict[str, list[torch.Tensor | None]]:
    out = {
        name: [None if p.grad is None else p.grad.clone() for p in a.params]
        for name, a in engine.adapters.items()
    }
    for a in engine.adapters.values():
        a.optimizer.zero_grad(set_to_none=True)
    return out


def calls(engine: Engine) -> list[ForwardBackwardRequest]:
    """PPO for A (with a KL penalty) and D (token-sum, scaled, another temperature), a second call for
    A at another temperature (agents sharing an adapter), cross-entropy for B, a critic call."""
    value_data = [
        Datum(tokens=d.tokens, returns=[0.5] * len(d.tokens)) for d in ppo_data(engine, "A", 40, n=3)
    ]
    return [
        ForwardBackwardRequest(
            adapter="A", loss="ppo", data=ppo_data(engine, "A", 41), ppo=PPOConfig(kl_coef=0.1)
        ),
        ForwardBackwardRequest(
            adapter="D",
            loss="ppo",
            data=ppo_data(engine, "D", 42, n=5),
            temperature=0.7,
            loss_scale=0.5,
            ppo=PPOConfig(aggregation="token-sum", entropy_coef=0.01),
        ),
        ForwardBackwardRequest(adapter="A", loss="ppo", data=ppo_data(engine, "A", 43, n=2), temperature=1.3),
        ForwardBackwardRequest(adapter="B", loss="cross_entropy", data=ppo_data(engine, "B", 44, n=4)),
        ForwardBackwardRequest(adapter="C", loss="value", data=value_data, value=ValueConfig(clip=None)),
    ]


@pytest.fixture(autouse=True, params=[False, True], ids=["runs", "stacked"])
def lora_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every test on both ways a shared pass takes its rows' LoRA terms (lora_batch.TRAIN_STACKED:
    the runs a CPU takes, and the stacked products a GPU takes); yields how many layers took the
    stacked one, so the tests can check it was taken."""
    monkeypatch.setattr(lora_batch, "TRAIN_STACKED", request.param)
    taken = [0]
    stacked = lora_batch._train_stacked

    def counted(*args: object) -> torch.Tensor:
        taken[0] += 1
        return stacked(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(lora_batch, "_train_stacked", counted)
    return taken


@pytest.fixture(scope="module")
def with_d(engine: Engine) -> Engine:
    if "D" not in engine.adapters:
        add_policy(engine, "D", seed=4)
    return engine


# one shared micro-batch; several, cut by a small budget; the head over 3 positions at a time, so
# its pieces cross calls of different temperatures
@pytest.mark.parametrize(("budget", "head_rows"), [(8192, 64), (40, 64), (8192, 3)])
def test_each_adapter_gets_the_gradients_of_its_own_calls(
    with_d: Engine, budget: int, head_rows: int, monkeypatch: pytest.MonkeyPatch, lora_path: list[int]
) -> None:
    engine = with_d
    monkeypatch.setattr(training, "HEAD_ROWS", head_rows)
    cs = [c.model_copy(update={"micro_batch_tokens": budget}) for c in calls(engine)]
    grads(engine)  # start from none
    alone = [engine.forward_backward(c) for c in cs]
    want = grads(engine)
    out = engine.forward_backward_batch(ForwardBackwardBatch(calls=cs))
    got = grads(engine)
    assert out.fused_passes >= 1
    assert (lora_path[0] > 0) == lora_batch.TRAIN_STACKED
    for name in ("A", "B", "C", "D"):
        for g, w in zip(got[name], want[name], strict=True):
            assert (g is None) == (w is None)
            if w is not None:
                # fp32 rounding: the shared pass pads to other lengths and sums in another order
                # (1e-5 measured), and the stacked products round every row's LoRA term their own
                # way, which this model's large random LoRA weights amplify (1.3e-4 measured; in
                # float64 the two ways agree, test below); a row through the wrong adapter or a
                # wrong normaliser is O(1)
                tol = 5e-4 if lora_batch.TRAIN_STACKED else 1e-4
                assert float((g - w).norm()) <= tol * float(w.norm()) + 1e-9, name
    for a, b in zip(out.results, alone, strict=True):
        assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-7)
        assert a.num_data == b.num_data and a.num_tokens == b.num_tokens
        assert a.stats.keys() == b.stats.keys()
        for k in b.stats:
            if k != "micro_batches":
                assert a.stats[k] == pytest.approx(b.stats[k], rel=1e-5, abs=1e-7), k


def test_a_shared_pass_leaves_every_other_tensor_alone(with_d: Engine) -> None:
    engine = with_d
    before = snapshot(engine)
    engine.forward_backward_batch(ForwardBackwardBatch(calls=calls(engine)[:2]))  # A and D
    engine.optim_step(OptimStepRequest(adapter="A"))
    engine.optim_step(OptimStepRequest(adapter="D"))
    after = snapshot(engine)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".A." in k or ".D." in k for k in changed)
    assert not any(k.startswith("B") or ".B." in k or ".C." in k for k in changed)


def test_a_bad_call_runs_nothing(with_d: Engine) -> None:
    engine = with_d
    grads(engine)
    bad = ForwardBackwardRequest(adapter="C", loss="ppo", data=ppo_data(engine, "A", 45, n=1))
    with pytest.raises(EngineError, match=r"calls\[1\]\.loss"):
        engine.forward_backward_batch(ForwardBackwardBatch(calls=[calls(engine)[0], bad]))
    assert all(g is None for gs in grads(engine).values() for g in gs)


def test_an_adapter_with_lora_on_fewer_layers_shares_a_pass(with_d: Engine, lora_path: list[int]) -> None:
    """Its rows get nothing from the layers it has no LoRA on (a zero part of that layer's runs, or
    no block of the stacked products), nor from a block of another rank."""
    engine = with_d
    engine.create_adapter(
        AdapterCreate(
            name="Q", base="b", lora=LoraConfig(r=2, alpha=8, target_modules=["q_proj", "up_proj"]), seed=9
        )
    )
    perturb(engine, "Q", 1009)
    try:
        cs = [
            ForwardBackwardRequest(adapter="A", loss="ppo", data=ppo_data(engine, "A", 46, n=3)),
            ForwardBackwardRequest(adapter="Q", loss="ppo", data=ppo_data(engine, "Q", 47, n=3)),
        ]
        grads(engine)
        for c in cs:
            engine.forward_backward(c)
        want = grads(engine)
        assert engine.forward_backward_batch(ForwardBackwardBatch(calls=cs)).fused_passes == 1
        assert (lora_path[0] > 0) == lora_batch.TRAIN_STACKED
        got = grads(engine)
        for name in ("A", "Q"):
            for g, w in zip(got[name], want[name], strict=True):
                assert w is not None and g is not None
                assert float((g - w).norm()) <= 1e-4 * float(w.norm()) + 1e-9, name
    finally:
        engine.delete_adapter("Q")


def test_interleaved_rows_each_take_their_own_adapter(with_d: Engine) -> None:
    """lora_batch.rows with gradients on rows in any order (runs of one adapter, not one per
    adapter): every row's logits equal its adapter's own forward, and the gradient reaches it."""
    engine = with_d
    base = engine.bases["b"]
    names = ["A", "D", "D", "A", "__base__", "A"]
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, base.vocab_size, (len(names), 7), generator=g)  # [B, T]
    with training_batch.all_active(base, [engine.adapters["A"], engine.adapters["D"]]):
        with lora_batch.rows(base.hf, names):
            logits = base.hf(input_ids=ids).logits  # [B, T, V]
        logits[3].sum().backward()  # row 3 is A's
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in engine.adapters["A"].params)
    assert all(p.grad is None or not p.grad.any() for p in engine.adapters["D"].params)  # D has no row 3
    grads(engine)
    with torch.no_grad():
        for i, a in enumerate(names):
            with training.active(base, None if a == "__base__" else engine.adapters[a]):
                own = base.hf(input_ids=ids[i : i + 1]).logits[0]  # [T, V]
            assert torch.allclose(logits[i].detach(), own, atol=1e-5), (i, a)


def test_the_stacked_products_compute_what_the_runs_do(tmp_path: Path, lora_path: list[int]) -> None:
    """In float64, where rounding cannot hide a wrong block, rank or scaling, a shared pass's
    gradients are the same whichever way it takes its rows' LoRA terms: three adapters of different
    ranks, scalings and layers, one of them in two runs of rows."""
    e = Engine(device="cpu", max_batch=64, checkpoint_root=str(tmp_path))
    try:
        e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32"))
        add_policy(e, "A", seed=1)
        add_policy(e, "D", seed=4)
        e.create_adapter(
            AdapterCreate(
                name="Q",
                base="b",
                lora=LoraConfig(r=2, alpha=3, target_modules=["q_proj", "up_proj"]),
                seed=9,
            )
        )
        perturb(e, "Q", 1009)
        cs = [
            ForwardBackwardRequest(adapter="A", loss="ppo", data=ppo_data(e, "A", 51, n=3)),
            ForwardBackwardRequest(adapter="Q", loss="ppo", data=ppo_data(e, "Q", 52, n=2), temperature=0.7),
            ForwardBackwardRequest(adapter="A", loss="ppo", data=ppo_data(e, "A", 53, n=2), temperature=1.3),
            ForwardBackwardRequest(adapter="D", loss="cross_entropy", data=ppo_data(e, "D", 54, n=3)),
        ]

        def to_float64() -> None:
            e.bases["b"].hf.double()
            for a in e.adapters.values():
                for p in a.params:
                    p.data = p.data.double()

        e.compute.call(to_float64)
        lora_batch.bump()
        got = {}
        for stacked in (False, True):
            lora_batch.TRAIN_STACKED = stacked
            out = e.forward_backward_batch(ForwardBackwardBatch(calls=cs))
            assert out.fused_passes == 1
            got[stacked] = grads(e)
            assert (lora_path[0] > 0) == stacked
        for name in ("A", "D", "Q"):
            for g, w in zip(got[True][name], got[False][name], strict=True):
                assert g is not None and w is not None and g.dtype == torch.float64
                assert float((g - w).norm()) <= 1e-12 * float(w.norm()), name
    finally:
        e.close()
