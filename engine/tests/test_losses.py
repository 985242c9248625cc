"""The loss functions against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from marft_engine import losses

PPO = dict(
    clip_low=0.2,
    clip_high=0.2,
    entropy_coef=0.0,
    kl_coef=0.0,
    kl_estimator="k3",
    ratio_level="token",
    sequence_logprob="sum",
    aggregation="token-mean",
)


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_ppo_zero_at_ratio_one_with_zero_advantage() -> None:
    logp = t([0.0, -1.0, -2.0], [0.0, -0.5, -0.3]).requires_grad_(True)
    w = t([0, 1, 1], [0, 1, 0])
    terms = losses.ppo_loss(logp, logp.detach(), torch.zeros_like(logp), w, None, None, norm=3.0, **PPO)
    assert terms.loss.item() == 0.0
    assert torch.equal(terms.ratio, torch.ones_like(logp))


def test_ppo_unclipped_and_clipped_by_hand() -> None:
    # token 1: ratio e^0.1 = 1.105 inside [0.8, 1.2], A = 2 -> -2.2103
    # token 2: ratio e^0.5 = 1.6487 > 1.2 with A = 1 -> clipped: -1.2
    # token 3: ratio e^-0.5 = 0.6065 < 0.8 with A = -1 -> clipped: -(0.8 * -1) = 0.8
    # token 4: ratio e^-0.5 with A = +1 -> min(0.6065, 0.8) = unclipped: -0.6065
    old = t([0.0, -1.0, -1.0, -1.0, -1.0])
    new = t([0.0, -0.9, -0.5, -1.5, -1.5])
    adv = t([0.0, 2.0, 1.0, -1.0, 1.0])
    w = t([0, 1, 1, 1, 1])
    terms = losses.ppo_loss(new, old, adv, w, None, None, norm=4.0, **PPO)
    per_token = [-2 * math.exp(0.1), -1.2, 0.8, -math.exp(-0.5)]
    assert terms.loss.item() == pytest.approx(sum(per_token) / 4, abs=1e-12)
    assert terms.clipped[0].tolist() == [False, False, True, True, False]


def test_ppo_asymmetric_clip_token_sum_and_sequence_ratio() -> None:
    old = t([0.0, -1.0, -1.0], [0.0, -2.0, -2.0])
    new = t([0.0, -0.8, -1.0], [0.0, -2.0, -2.0])
    adv = t([0.0, 1.0, 1.0], [0.0, -1.0, -1.0])
    w = t([0, 1, 1], [0, 1, 1])
    cfg = dict(PPO, clip_high=0.1, aggregation="token-sum")
    terms = losses.ppo_loss(new, old, adv, w, None, None, norm=2.0, **cfg)
    # datum 0: ratios e^0.2 = 1.2214 (clipped to 1.1) and 1 -> -(1.1 + 1); datum 1: ratio 1, A = -1 -> +2
    assert terms.loss.item() == pytest.approx((-(1.1 + 1.0) + 2.0) / 2, abs=1e-12)
    seq = dict(PPO, ratio_level="sequence", sequence_logprob="mean")
    terms = losses.ppo_loss(new, old, adv, w, None, None, norm=4.0, **seq)
    r0 = math.exp(0.1)  # mean log-ratio of datum 0 = 0.2 / 2, inside the clip range
    assert terms.ratio[0, 1].item() == pytest.approx(r0)
    assert terms.loss.item() == pytest.approx((-2 * r0 + 2.0) / 4, abs=1e-12)


def test_ppo_entropy_bonus_and_kl_penalty() -> None:
    logp = t([0.0, -1.0])
    ref = t([0.0, -1.5])
    ent = t([0.0, 2.0])
    w = t([0, 1])
    cfg = dict(PPO, entropy_coef=0.1, kl_coef=0.5, kl_estimator="k3")
    terms = losses.ppo_loss(logp, logp, torch.zeros_like(logp), w, ent, ref, norm=1.0, **cfg)
    k3 = math.exp(-0.5) + 0.5 - 1
    assert terms.loss.item() == pytest.approx(-0.1 * 2.0 + 0.5 * k3, abs=1e-12)
    assert losses.kl_penalty(logp, ref, "k1")[0, 1].item() == pytest.approx(0.5)
    assert losses.kl_penalty(logp, ref, "k2")[0, 1].item() == pytest.approx(0.125)


def test_importance_sampling_and_cross_entropy() -> None:
    old = t([0.0, -1.0])
    new = t([0.0, -0.5])
    adv = t([0.0, 3.0])
    w = t([0, 1])
    loss, ratio = losses.importance_sampling_loss(new, old, adv, w, aggregation="token-mean", norm=1.0)
    assert loss.item() == pytest.approx(-3 * math.exp(0.5))
    assert losses.cross_entropy_loss(new, w, aggregation="token-mean", norm=1.0).item() == pytest.approx(0.5)


def test_value_loss_clipped_mse_and_huber_by_hand() -> None:
    v = t([0.0, 1.0, 0.5])
    old = t([0.0, 0.5, 0.5])
    ret = t([0.0, 2.0, 0.0])
    w = t([0, 1, 1])
    # token 1: v - R = -1 -> 0.5; v_clip = 0.5 + 0.2 = 0.7 -> 0.5 * 1.69 = 0.845 (max -> 0.845)
    # token 2: v = old -> 0.5 * 0.25 = 0.125 both ways
    loss, active = losses.value_loss(
        v, ret, old, w, kind="mse", huber_delta=1.0, clip=0.2, aggregation="token-mean", norm=2.0
    )
    assert loss.item() == pytest.approx((0.845 + 0.125) / 2, abs=1e-12)
    assert active[0].tolist() == [False, True, False]
    loss, _ = losses.value_loss(
        v, ret, None, w, kind="mse", huber_delta=1.0, clip=None, aggregation="token-mean", norm=2.0
    )
    assert loss.item() == pytest.approx((0.5 + 0.125) / 2, abs=1e-12)
    # Huber delta 0.5: |x| = 1 -> 0.5 * (1 - 0.25) = 0.375; |x| = 1.3 -> 0.5 * (1.3 - 0.25) = 0.525; 0.5 -> 0.125
    loss, _ = losses.value_loss(
        v, ret, old, w, kind="huber", huber_delta=0.5, clip=0.2, aggregation="token-mean", norm=2.0
    )
    assert loss.item() == pytest.approx((0.525 + 0.125) / 2, abs=1e-12)


def test_logprobs_and_entropies_alignment_and_temperature() -> None:
    logits = torch.randn(2, 4, 7, dtype=torch.float64)
    tokens = torch.randint(0, 7, (2, 4))
    lp, ent = losses.logprobs_and_entropies(logits, tokens, 0.5)
    assert lp[:, 0].abs().sum() == 0 and ent[:, 0].abs().sum() == 0
    expect = torch.log_softmax(logits[1, 2] / 0.5, -1)[tokens[1, 3]]
    assert lp[1, 3].item() == pytest.approx(expect.item())
    p = torch.softmax(logits[1, 2] / 0.5, -1)  # the prediction of token 3 from tokens[:3]
    assert ent[1, 3].item() == pytest.approx(-(p * p.log()).sum().item())


def test_unweighted_positions_cannot_poison_the_loss() -> None:
    # a prompt position with a wild old log-prob: exp would overflow to inf, and inf * 0 is nan
    logp = torch.tensor([[0.0, -1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[0.0, -200.0, -1.0]])
    adv = torch.tensor([[0.0, 5.0, 1.0]])
    w = torch.tensor([[0.0, 0.0, 1.0]])
    ref = torch.tensor([[0.0, -300.0, -1.0]])
    terms = losses.ppo_loss(logp, old, adv, w, None, ref, norm=1.0, **dict(PPO, kl_coef=0.1))
    terms.loss.backward()
    assert terms.loss.item() == pytest.approx(-1.0)
    assert torch.isfinite(logp.grad).all()
    loss, _ = losses.importance_sampling_loss(logp, old, adv, w, aggregation="token-mean", norm=1.0)
    assert loss.item() == pytest.approx(-1.0)
