"""Speculative decoding with prompt-lookup drafts: a row whose request sets `draft_tokens` feeds, after
its last token, the tokens that followed the latest earlier occurrence of its last MATCH tokens in its
own prompt and response; one pass computes the logits at every fed position, and `verify_drafts`
keeps the drafted tokens that exact speculative sampling accepts, plus one more token.

Why: a decode step reads every weight of the model whatever its batch; where that read bounds the
step (a GPU, or bf16 weights on a CPU with AMX, docs/MEASUREMENTS.md), a step over a few more
positions costs little more than one, and an agent that restates its prompt or an earlier agent's
answer, or loops, emits several tokens a step. A team's episode is a chain of its agents' answers,
so fewer steps per answer shorten the rollout's longest path, which batching cannot.

Exactness (Leviathan et al. 2023, Chen et al. 2023, with a draft that is one token for sure): a
drafted token d is accepted with probability p(d) under the row's sampling distribution p (tempered,
then truncated by top-k / top-p); if it is rejected, the token is drawn from p without d,
renormalised. So each token is drawn from p, as without drafts: P(d) = p(d) and, for x != d,
P(x) = (1 - p(d)) p(x) / (1 - p(d)) = p(x). Greedy rows accept d where it is the argmax. A row's
draws come from its own generator in a fixed order (per drafted position an acceptance uniform and
a draw uniform, then one for the position after the draft), so its tokens depend on its seed and its
own tokens, not on its batch, as without drafts; they are another draw than without drafts.

Shapes: M = positions verified (over all rows), V = vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
import torch.nn.functional as F

from .schemas import SamplingParams
from .token_choice import inverse_cdf, truncate

MATCH = 2  # tokens a draft's context must repeat (2: the best of 1-3 on a 4-agent rollout's text)
# A step that drafts feeds at most this many positions in all (rows x (1 + longest draft)): past
# about this many, a CPU step costs about as much more as its drafts save (the LM head and the token
# choice run per position), so a large batch decodes without drafts and a small one, where a step is
# bound by reading the weights, drafts most (docs/MEASUREMENTS.md). Unmeasured on a GPU.
STEP_POSITIONS = 64


class PromptLookup:
    """One row's drafts: `after` maps each MATCH-gram of its tokens so far to the index of the token
    that followed its latest occurrence, kept up to date as tokens are added (O(1) a token)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}
        self.extend(ids)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            m = len(self.ids)
            if m >= MATCH:
                self.after[tuple(self.ids[m - MATCH : m])] = m
            self.ids.append(t)

    def draft(self, k: int) -> list[int]:
        """Up to k tokens: those after the latest earlier occurrence of the last MATCH tokens."""
        if k <= 0 or len(self.ids) < MATCH:
            return []
        at = self.after.get(tuple(self.ids[-MATCH:]))
        return [] if at is None else self.ids[at : at + k]


@dataclass
class Verified:
    tokens: torch.Tensor  # [M] the token each position emits, if the row gets that far
    accepted: torch.Tensor  # [M] bool: the position's draft was accepted (its token is the draft)
    logprobs: torch.Tensor  # [M] under the tempered policy
    sampler_logprobs: torch.Tensor  # [M] under the distribution drawn from, p (greedy: 0)


def verify_drafts(
    logits: torch.Tensor,  # [M, V] at each verified position
    temperatures: torch.Tensor,  # [M] float32 (the row's); 0 = greedy
    top_k: torch.Tensor,  # [M] long; 0 = no top-k
    top_p: torch.Tensor,  # [M] float32 in (0, 1]
    drafts: torch.Tensor,  # [M] long: the drafted token at this position, -1 where none (a plain draw)
    accept_u: torch.Tensor,  # [M] float64 in [0, 1): the acceptance test's uniform
    draw_u: torch.Tensor,  # [M] float64 in [0, 1): the draw's uniform (from p, or p without the draft)
) -> Verified:
    """Each position's outcome, independently of the others; a row emits its positions' tokens in
    order up to and including its first position that is not an accepted draft."""
    greedy = temperatures == 0  # [M]
    temps = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    policy = F.log_softmax(logits / temps[:, None], dim=-1)  # [M, V]
    sampler = policy
    truncated = ~greedy & ((top_k > 0) | (top_p < 1))  # [M]
    if truncated.any():
        rows = truncated.nonzero()[:, 0]
        sampler = policy.clone()
        sampler[rows] = truncate(policy[rows], top_k[rows], top_p[rows])
    has = drafts >= 0  # [M]
    d = drafts.clamp_min(0)  # [M]
    best = logits.argmax(-1)  # [M]
    p_d = sampler.gather(1, d[:, None])[:, 0].double().exp()  # [M] p(draft)
    accepted = has & torch.where(greedy, d == best, accept_u < p_d)  # [M]
    tokens = torch.where(accepted | greedy, torch.where(accepted, d, best), 0)  # [M]
    draw = (~accepted & ~greedy).nonzero()[:, 0]  # [R] positions that draw a token
    if len(draw):
        rest = sampler[draw]  # [R, V] p, without the draft where there is one
        rest = rest.scatter(
            1, d[draw, None], torch.where(has[draw, None], float("-inf"), rest.gather(1, d[draw, None]))
        )
        drawn = inverse_cdf(rest, draw_u[draw])  # [R]
        # p without the draft has no mass only where p(draft) rounds to 1: the draft is the token then
        empty = torch.isinf(rest.gather(1, drawn[:, None])[:, 0])
        drawn = torch.where(empty, d[draw], drawn)
        tokens[draw] = drawn
        accepted[draw] = has[draw] & empty
    logprobs = policy.gather(1, tokens[:, None])[:, 0]
    sampler_logprobs = sampler.gather(1, tokens[:, None])[:, 0].masked_fill(greedy, 0.0)
    return Verified(tokens=tokens, accepted=accepted, logprobs=logprobs, sampler_logprobs=sampler_logprobs)


class Drafting(Protocol):
    """What `take` reads of a row (the sampler's Row)."""

    params: SamplingParams
    generator: torch.Generator | None  # None for greedy
    finish: str | None


R = TypeVar("R", bound=Drafting)


def take(
    rows: Sequence[R],
    drafts: list[list[int]],  # per row its drafted tokens (maybe none)
    logits: torch.Tensor,  # [M, V] at each row's last token and its drafts, rows in order
    emit: Callable[[R, int, float, float], None],  # (row, token, log-prob, sampler log-prob)
) -> list[int]:
    """Verify the rows' drafts and emit each row's tokens in order, up to its first position that is
    not an accepted draft, or until it finishes. Returns per row the fed positions it keeps: its last
    token and its accepted drafts (the emitted tokens' count)."""
    dev = logits.device
    accept_u: list[torch.Tensor] = []
    draw_u: list[torch.Tensor] = []
    for r, d in zip(rows, drafts, strict=True):  # per drafted position (accept, draw), then a draw
        L = len(d)
        if r.generator is None:
            u = torch.zeros(2 * L + 1, dtype=torch.float64, device=dev)
        else:
            u = torch.rand(2 * L + 1, generator=r.generator, dtype=torch.float64, device=dev)
        accept_u += [u[: 2 * L : 2], torch.zeros(1, dtype=torch.float64, device=dev)]
        draw_u += [u[1 : 2 * L : 2], u[2 * L :]]
    per = [(r.params, len(d) + 1) for r, d in zip(rows, drafts, strict=True)]
    v = verify_drafts(
        logits,
        torch.tensor([p.temperature for p, n in per for _ in range(n)], device=dev),
        torch.tensor([p.top_k for p, n in per for _ in range(n)], device=dev),
        torch.tensor([p.top_p for p, n in per for _ in range(n)], device=dev),
        torch.tensor([t for d in drafts for t in [*d, -1]], device=dev),
        torch.cat(accept_u),
        torch.cat(draw_u),
    )
    tokens, accepted = v.tokens.tolist(), v.accepted.tolist()
    logprobs, sampler_logprobs = v.logprobs.tolist(), v.sampler_logprobs.tolist()
    kept: list[int] = []
    j = 0
    for r, d in zip(rows, drafts, strict=True):
        n = 0
        while n <= len(d):
            emit(r, tokens[j + n], logprobs[j + n], sampler_logprobs[j + n])
            n += 1
            if r.finish is not None or not accepted[j + n - 1]:
                break
        kept.append(n)
        j += len(d) + 1
    return kept
