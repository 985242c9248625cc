"""Token choice as a pure function: logits and each row's sampling parameters and uniform draw in,
tokens and log-probs out. No model, no generator, no state, so it can be tested by hand.

Shapes: B = rows, V = vocabulary, K = the most tokens a row's top-k keeps.

Every sampled row draws its token by inverse-CDF sampling from one uniform in [0, 1): the first token
whose cumulative probability, in vocabulary order, exceeds u times the total. The caller draws u from
the row's own seeded generator, so a row's tokens do not depend on the rest of its batch. Why not
torch.multinomial: on a CPU it draws one exponential per vocabulary entry, a noticeable share of a
decode step with a large vocabulary. The CDF is summed in float64, so it resolves tokens of
probability far below float32's 6e-8 steps near 1, and in two levels (`inverse_cdf`): blocks of the
vocabulary, then the tokens of one block, so a step does not take a float64 pass over the whole
vocabulary for each row.
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
    B = logits.shape[0]
    greedy = temperatures == 0  # [B]
    temps = torch.where(greedy, torch.ones_like(temperatures), temperatures)  # [B]
    # x / 1 is x exactly: at temperature 1 (or greedy) everywhere, skip a pass over [B, V]
    scaled = logits if bool((temps == 1).all()) else logits / temps[:, None]
    policy = F.log_softmax(scaled, dim=-1)  # [B, V] the tempered policy
    tokens = torch.zeros(B, dtype=torch.long, device=logits.device)  # [B]
    sampler_logprobs = torch.zeros(B, dtype=policy.dtype, device=logits.device)  # [B]; greedy: 0
    if greedy.any():
        tokens[greedy] = logits[greedy].argmax(-1)
    truncated = ~greedy & ((top_k > 0) | (top_p < 1))  # [B]
    if truncated.any():
        rows = truncated.nonzero()[:, 0]  # [R]
        sub = policy if len(rows) == B else policy[rows]  # every row: no gathered copy
        tokens[rows], sampler_logprobs[rows] = _draw_truncated(sub, top_k[rows], top_p[rows], uniforms[rows])
    full = ~greedy & ~truncated  # [B]
    if full.any():
        rows = full.nonzero()[:, 0]  # [S]
        sub = policy if len(rows) == B else policy[rows]
        drawn = inverse_cdf(sub, uniforms[rows])  # [S]
        tokens[rows], sampler_logprobs[rows] = drawn, sub.gather(1, drawn[:, None])[:, 0]
    logprobs = policy.gather(1, tokens[:, None])[:, 0]  # [B]
    return Choice(tokens=tokens, logprobs=logprobs, sampler_logprobs=sampler_logprobs)


def _draw_truncated(
    logp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows drawn from their truncated policy: the token `inverse_cdf` would draw from `truncate`'s
    [R, V], found among the K kept candidates alone, so no pass over the vocabulary beyond top-k
    (those passes were most of a decode step's token choice, docs/MEASUREMENTS.md). Returns
    (tokens [R], their log-probs under the truncated distribution [R])."""
    idx, kept = _kept(logp, top_k, top_p)  # [R, K] each
    order = idx.argsort(-1)  # [R, K]: the candidates in vocabulary order, as inverse_cdf sums them
    idx, kept = idx.gather(1, order), kept.gather(1, order)
    cum = kept.exp().double().cumsum(-1)  # [R, K]; the dropped candidates have probability 0
    target = uniforms * cum[:, -1]  # [R]
    last = (cum < cum[:, -1:]).sum(-1)  # [R] the last candidate of positive probability
    j = torch.minimum(torch.searchsorted(cum, target[:, None], right=True)[:, 0], last)[:, None]
    return idx.gather(1, j)[:, 0], kept.gather(1, j)[:, 0]


BLOCK = 256  # vocabulary entries per block of the two-level CDF (`inverse_cdf`)


def inverse_cdf(
    logp: torch.Tensor,  # [S, V] log-probs (-inf: never drawn)
    uniforms: torch.Tensor,  # [S] float64 in [0, 1)
) -> torch.Tensor:
    """[S] the first token, in vocabulary order, whose cumulative probability exceeds u times the
    total; never one of probability 0. Cumulative sums in float64, first over blocks of BLOCK
    tokens [S, V / BLOCK], then within the one block the target falls in [S, BLOCK]."""
    S, V = logp.shape
    nb = -(-V // BLOCK)
    p = logp.exp()  # [S, V]
    if V % BLOCK:
        p = F.pad(p, (0, nb * BLOCK - V))  # [S, nb * BLOCK]; the padding has probability 0
    blocks = p.view(S, nb, BLOCK)  # [S, nb, BLOCK]
    # converted, then summed: `sum(dtype=float64)` converts as it goes, much slower on a CPU
    cum = blocks.double().sum(-1).cumsum(-1)  # [S, nb]
    target = uniforms * cum[:, -1]  # [S]
    # right=True: the first block whose CDF exceeds the target; rounding past the end takes the last
    # block with any mass
    last_block = (cum < cum[:, -1:]).sum(-1)  # [S]
    j = torch.minimum(torch.searchsorted(cum, target[:, None], right=True)[:, 0], last_block)  # [S]
    before = torch.where(j > 0, cum.gather(1, (j - 1).clamp_min(0)[:, None])[:, 0], 0.0)  # [S]
    rows = torch.arange(S, device=logp.device)
    inner = blocks[rows, j].double().cumsum(-1)  # [S, BLOCK]
    last = (inner < inner[:, -1:]).sum(-1)  # [S] the block's last token of positive probability
    k = torch.minimum(torch.searchsorted(inner, (target - before)[:, None], right=True)[:, 0], last)
    return j * BLOCK + k  # [S]


def truncate(
    logp: torch.Tensor,  # [R, V] log-probs
    top_k: torch.Tensor,  # [R] long; 0 = no top-k
    top_p: torch.Tensor,  # [R] in (0, 1]; 1 = no top-p
) -> torch.Tensor:
    """The top-k, then top-p (the most likely tokens that hold top_p of the top-k's mass) tokens of
    each row, renormalised: [R, V] log-probs, -inf elsewhere."""
    idx, kept = _kept(logp, top_k, top_p)
    return torch.full_like(logp, float("-inf")).scatter(-1, idx, kept)  # [R, V]


def _kept(logp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`truncate`'s candidates: (their tokens [R, K], most likely first; their renormalised
    log-probs [R, K], -inf where top-k or top-p drops them)."""
    V = logp.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp_max(V), V)  # [R]
    vals, idx = torch.topk(logp, int(k.max()), dim=-1)  # [R, K] sorted descending
    keep = torch.arange(vals.shape[-1], device=logp.device)[None, :] < k[:, None]  # [R, K] the top-k
    probs = vals.exp() * keep  # [R, K]
    before = probs.cumsum(-1) - probs  # [R, K] mass strictly above each token
    nucleus = before < top_p[:, None] * probs.sum(-1, keepdim=True)  # [R, K]
    keep &= nucleus | (top_p >= 1)[:, None]
    kept = vals.masked_fill(~keep, float("-inf"))  # [R, K]
    return idx, kept - torch.logsumexp(kept, -1, keepdim=True)
