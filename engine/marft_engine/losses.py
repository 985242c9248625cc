"""Loss functions as pure tensor math (no model, no state), so they can be tested by hand.

Shapes: B = data in the micro-batch, T = padded sequence length, V = vocabulary.
Per-token tensors are aligned with the tokens: position t holds the prediction of token t from
tokens[:t]; position 0 has no prediction and must carry weight 0.

Every loss returns the micro-batch's share of the WHOLE call's loss: a sum over its tokens or data
divided by a normaliser computed over the whole call (`norm`), so summing the micro-batches'
gradients equals the gradient of one full batch exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def logprobs_and_entropies(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) [B, T] from logits [B, T, V] under softmax(logits / temperature): logp[b, t]
    = log p(tokens[b, t] | tokens[b, :t]), entropy[b, t] that of the same prediction; entry 0 is 0
    (it has no prediction)."""
    logp = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)  # [B, T-1, V]
    picked = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [B, T-1]
    ent = -(logp.exp() * logp).sum(-1)  # [B, T-1]
    return F.pad(picked, (1, 0)), F.pad(ent, (1, 0))


def selected_logprobs_and_entropies(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """For N selected positions only: logits [N, V] predicting tokens [N] -> (logp [N], entropy [N])."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # [N, V]
    picked = logp.gather(-1, tokens[:, None]).squeeze(-1)  # [N]
    ent = -(logp.exp() * logp).sum(-1)  # [N]
    return picked, ent


def scatter_selected(values: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """values [N] of the True entries of sel [B, T] (row-major order) back in place; zeros elsewhere."""
    return torch.zeros(sel.shape, dtype=values.dtype, device=values.device).masked_scatter(sel, values)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (Schulman's k1/k2/k3)."""
    log_ratio = ref_logp - logp  # [B, T]  log(ref / policy)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return log_ratio.exp() - log_ratio - 1
    raise ValueError(f"kl_estimator: unknown {estimator!r}")


def aggregate(per_token: torch.Tensor, weights: torch.Tensor, aggregation: str, norm: float) -> torch.Tensor:
    """token-mean: sum(w * x) / norm, norm = the call's total weight.
    token-sum: sum over each datum's tokens, then / norm, norm = the call's number of data."""
    if aggregation not in ("token-mean", "token-sum"):
        raise ValueError(f"aggregation: unknown {aggregation!r}")
    return (per_token * weights).sum() / norm  # scalar


@dataclass
class PPOTerms:
    loss: torch.Tensor  # scalar, this micro-batch's share of the call's loss
    ratio: torch.Tensor  # [B, T]
    clipped: torch.Tensor  # [B, T] bool, where the clipped branch is the active one
    kl_ref: torch.Tensor | None  # [B, T]


def ppo_loss(
    logp: torch.Tensor,  # [B, T] under the current policy (with grad)
    old_logp: torch.Tensor,  # [B, T] under the policy that sampled
    advantages: torch.Tensor,  # [B, T]
    weights: torch.Tensor,  # [B, T]
    entropies: torch.Tensor | None,  # [B, T] (with grad) when entropy_coef != 0
    ref_logp: torch.Tensor | None,  # [B, T] reference log-probs when kl_coef > 0
    *,
    clip_low: float,
    clip_high: float,
    entropy_coef: float,
    kl_coef: float,
    kl_estimator: str,
    ratio_level: str,
    sequence_logprob: str,
    aggregation: str,
    norm: float,
) -> PPOTerms:
    """Clipped surrogate -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) per token.

    ratio_level "sequence": one ratio per datum from the action's log-prob (weighted token sum or
    mean), applied to every action token of that datum."""
    on = weights > 0  # [B, T] unweighted positions (prompt, padding) must not overflow exp into inf * 0
    if ratio_level == "token":
        log_ratio = (logp - old_logp) * on  # [B, T]
    elif ratio_level == "sequence":
        w_sum = weights.sum(-1, keepdim=True).clamp_min(1e-8)  # [B, 1]
        seq = ((logp - old_logp) * on * weights).sum(-1, keepdim=True)  # [B, 1]
        if sequence_logprob == "mean":
            seq = seq / w_sum
        log_ratio = seq.expand_as(logp)  # [B, T]
    else:
        raise ValueError(f"ratio: unknown {ratio_level!r}")
    ratio = log_ratio.exp()  # [B, T]
    unclipped = ratio * advantages  # [B, T]
    clipped_ratio = ratio.clamp(1 - clip_low, 1 + clip_high)  # [B, T]
    clipped = clipped_ratio * advantages  # [B, T]
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    if entropy_coef != 0 and entropies is not None:
        per_token = per_token - entropy_coef * entropies
    kl = None
    if ref_logp is not None:
        kl = kl_penalty(logp * on, ref_logp * on, kl_estimator)  # [B, T]
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl
    loss = aggregate(per_token, weights, aggregation, norm)
    return PPOTerms(loss=loss, ratio=ratio, clipped=clipped < unclipped, kl_ref=kl)


def importance_sampling_loss(
    logp: torch.Tensor,  # [B, T]
    old_logp: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    weights: torch.Tensor,  # [B, T]
    *,
    aggregation: str,
    norm: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unclipped off-policy policy gradient: -(p / q) A per token. Returns (loss, ratio [B, T])."""
    ratio = ((logp - old_logp) * (weights > 0)).exp()  # [B, T] unweighted positions: ratio 1
    return aggregate(-ratio * advantages, weights, aggregation, norm), ratio


def cross_entropy_loss(
    logp: torch.Tensor,  # [B, T]
    weights: torch.Tensor,  # [B, T]
    *,
    aggregation: str,
    norm: float,
) -> torch.Tensor:
    """Negative log-likelihood of the weighted tokens (supervised warm start)."""
    return aggregate(-logp, weights, aggregation, norm)


def huber(x: torch.Tensor, delta: float) -> torch.Tensor:
    a = x.abs()
    return torch.where(a <= delta, 0.5 * x**2, delta * (a - 0.5 * delta))


def value_loss(
    values: torch.Tensor,  # [B, T] predictions (with grad)
    returns: torch.Tensor,  # [B, T] targets
    old_values: torch.Tensor | None,  # [B, T] predictions at sampling time, for clipping
    weights: torch.Tensor,  # [B, T]
    *,
    kind: str,
    huber_delta: float,
    clip: float | None,
    aggregation: str,
    norm: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-style clipped value loss: max(l(v - R), l(v_clip - R)), v_clip = old + clamp(v - old, ±clip).
    l = 0.5 x^2 (mse) or Huber. Returns (loss, clipped-branch-active mask [B, T])."""

    def err(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x**2 if kind == "mse" else huber(x, huber_delta)

    per_token = err(values - returns)  # [B, T]
    active = torch.zeros_like(per_token, dtype=torch.bool)  # [B, T]
    if clip is not None and old_values is not None:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)  # [B, T]
        clipped = err(v_clip - returns)  # [B, T]
        active = clipped > per_token
        per_token = torch.maximum(per_token, clipped)
    return aggregate(per_token, weights, aggregation, norm), active
