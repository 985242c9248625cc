"""Token choice as a pure function: logits and each row's sampling parameters and uniform draw in,
tokens and log-probs out. No model, no generator, no state, so it can be tested by hand.

Shapes: B = rows, V = vocabulary, K = the most tokens a row's top-k keeps.

Every sampled row draws its token by inverse-CDF sampling from one uniform in [0, 1): the first token
whose cumulative probability, in vocabulary order, exceeds u times the total. The caller draws u from
the row's own seeded generator, so a row's tokens do not depend on the rest of its batch. Why not
torch.multinomial: on a CPU it draws one exponential per vocabulary entry, a noticeable share of a
decode step with a large vocabulary. float64 so the CDF resolves tokens of probability far below
float32's 6e-8 steps near 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Choice:
    tokens: torch.Tensor  # [B] long
    logprobs: torch.Tensor  # [B] under the tempered policy softmax(logits / temperature)
    sampler_logprobs: torch.Tensor  # [B] under the distribution the token was drawn from (greedy: 0)


def choose_tokens(
    logits: torch.Tensor,  # [B, V]
    temperatures: torch.Tensor,  # [B] float32; 0 = greedy
    top_k: torch.Tensor,  # [B] long; 0 = no top-k
    top_p: torch.Tensor,  # [B] float32 in (0, 1]; 1 = no top-p
    uniforms: torch.Tensor,  # [B] float64 in [0, 1); ignored on greedy rows
) -> Choice:
    """One token per row. Greedy rows take the argmax, and report log-probs at temperature 1. Other
    rows sample softmax(logits / temperature), truncated to its top-k and top-p tokens and
    renormalised where those are set; their log-probs are under the tempered policy (truncation is
    not part of it, see schemas.py), their sampler log-probs under the truncated distribution."""
    B, V = logits.shape
    greedy = temperatures == 0  # [B]
    temps = torch.where(greedy, torch.ones_like(temperatures), temperatures)  # [B]
    policy = F.log_softmax(logits / temps[:, None], dim=-1)  # [B, V] the tempered policy
    sampler = policy  # [B, V] the distribution each row draws from
    truncated = ~greedy & ((top_k > 0) | (top_p < 1))  # [B]
    if truncated.any():
        rows = truncated.nonzero()[:, 0]  # [R]
        sampler = policy.clone()
        sampler[rows] = truncate(policy[rows], top_k[rows], top_p[rows])
    tokens = logits.argmax(-1)  # [B] the greedy choice; sampled rows are overwritten
    drawn = (~greedy).nonzero()[:, 0]  # [S]
    if len(drawn):
        cdf = sampler[drawn].double().exp().cumsum(-1)  # [S, V]
        target = (uniforms[drawn] * cdf[:, -1])[:, None]  # [S, 1]
        # right=True: the first token whose CDF exceeds the target, so never one of probability 0
        tokens[drawn] = torch.searchsorted(cdf, target, right=True).clamp_max(V - 1)[:, 0]
    logprobs = policy.gather(1, tokens[:, None])[:, 0]  # [B]
    sampler_logprobs = sampler.gather(1, tokens[:, None])[:, 0].masked_fill(greedy, 0.0)  # [B]
    return Choice(tokens=tokens, logprobs=logprobs, sampler_logprobs=sampler_logprobs)


def truncate(
    logp: torch.Tensor,  # [R, V] log-probs
    top_k: torch.Tensor,  # [R] long; 0 = no top-k
    top_p: torch.Tensor,  # [R] in (0, 1]; 1 = no top-p
) -> torch.Tensor:
    """The top-k, then top-p (the most likely tokens that hold top_p of the top-k's mass) tokens of
    each row, renormalised: [R, V] log-probs, -inf elsewhere."""
    V = logp.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp_max(V), V)  # [R]
    vals, idx = torch.topk(logp, int(k.max()), dim=-1)  # [R, K] sorted descending
    keep = torch.arange(vals.shape[-1], device=logp.device)[None, :] < k[:, None]  # [R, K] the top-k
    probs = vals.exp() * keep  # [R, K]
    before = probs.cumsum(-1) - probs  # [R, K] mass strictly above each token
    nucleus = before < top_p[:, None] * probs.sum(-1, keepdim=True)  # [R, K]
    keep &= nucleus | (top_p >= 1)[:, None]
    kept = torch.full_like(logp, float("-inf")).scatter(-1, idx, vals.masked_fill(~keep, float("-inf")))
    return kept - torch.logsumexp(kept, -1, keepdim=True)  # [R, V]
