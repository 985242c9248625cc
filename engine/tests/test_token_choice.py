"""Token choice (token_choice.choose_tokens) against hand-computed tokens and log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from marft_engine.token_choice import BLOCK, choose_tokens, inverse_cdf, truncate

P = [0.1, 0.2, 0.3, 0.4]  # the policy at temperature 1 of every row below
LOGITS = [math.log(p) for p in P]


def choose(temperature: float, u: float, top_k: int = 0, top_p: float = 1.0) -> tuple[int, float, float]:
    """One row: (token, logprob, sampler logprob)."""
    c = choose_tokens(
        torch.tensor([LOGITS]),
        torch.tensor([temperature]),
        torch.tensor([top_k]),
        torch.tensor([top_p]),
        torch.tensor([u], dtype=torch.float64),
    )
    return int(c.tokens[0]), float(c.logprobs[0]), float(c.sampler_logprobs[0])


def test_full_vocabulary_is_the_inverse_cdf_in_vocabulary_order() -> None:
    # CDF [0.1, 0.3, 0.6, 1.0]: the first token whose CDF exceeds u
    for u, token in ((0.0, 0), (0.05, 0), (0.25, 1), (0.31, 2), (0.59, 2), (0.95, 3)):
        t, lp, slp = choose(1.0, u)
        assert t == token, u
        assert lp == pytest.approx(math.log(P[token]), abs=1e-6)
        assert slp == lp  # the sampler is the policy itself


def test_temperature_sharpens_the_policy_and_its_logprobs() -> None:
    # T = 0.5: p^2 / sum(p^2) = [1, 4, 9, 16] / 30, CDF [1/30, 5/30, 14/30, 1]
    t, lp, slp = choose(0.5, 0.2)
    assert t == 2 and lp == pytest.approx(math.log(9 / 30), abs=1e-6) and slp == lp
    assert choose(0.5, 14 / 30 + 1e-6)[0] == 3
    assert choose(0.5, 1 / 30 - 1e-6)[0] == 0


def test_greedy_takes_the_argmax_with_logprobs_at_temperature_one() -> None:
    t, lp, slp = choose(0.0, 0.99)  # the uniform is ignored
    assert t == 3 and lp == pytest.approx(math.log(0.4), abs=1e-6) and slp == 0.0


def test_top_k_renormalises_the_kept_tokens() -> None:
    # top-2 keeps tokens 3 (0.4) and 2 (0.3): [0, 0, 3/7, 4/7], CDF in vocabulary order [0, 0, 3/7, 1]
    for u, token in ((0.0, 2), (0.4, 2), (0.43, 3), (0.99, 3)):
        t, lp, slp = choose(1.0, u, top_k=2)
        assert t == token, u
        assert lp == pytest.approx(math.log(P[token]), abs=1e-6)  # the tempered policy's, untruncated
        assert slp == pytest.approx(math.log({2: 3 / 7, 3: 4 / 7}[token]), abs=1e-6)
    assert choose(1.0, 0.4, top_k=9)[:2] == choose(1.0, 0.4)[:2]  # k beyond the vocabulary: all of it
    # without top-p every top-k token stays, however small: here the mass above the third token
    # rounds to the whole top-k's mass in fp32, which a top-p test at top_p = 1 would cut
    tiny = truncate(
        torch.tensor([[0.0, 0.0, -20.0, -30.0]]).log_softmax(-1), torch.tensor([3]), torch.tensor([1.0])
    )
    assert torch.isfinite(tiny[0, :3]).all() and tiny[0, 3] == float("-inf")


def test_top_p_keeps_the_most_likely_tokens_holding_that_mass() -> None:
    # sorted 0.4, 0.3, 0.2, 0.1: mass strictly above each 0, 0.4, 0.7, 0.9
    t, _, slp = choose(1.0, 0.99, top_p=0.5)  # 0.4 < 0.5 <= 0.7: tokens 3 and 2
    assert t == 3 and slp == pytest.approx(math.log(4 / 7), abs=1e-6)
    assert choose(1.0, 0.0, top_p=0.5)[0] == 2
    t, lp, slp = choose(1.0, 0.0, top_p=0.35)  # only the most likely token
    assert t == 3 and lp == pytest.approx(math.log(0.4), abs=1e-6) and slp == pytest.approx(0.0, abs=1e-6)
    # with top-k, top_p is a share of the top-k's mass: top-2 holds 0.7, 0.55 of it is 0.385 < 0.4
    assert choose(1.0, 0.0, top_k=2, top_p=0.55)[0] == 3
    assert choose(1.0, 0.0, top_p=0.55)[0] == 2  # without top-k 0.55 of 1 takes tokens 3 and 2
    # the same next to a row that keeps more tokens (the batch's topk is wider than this row's k)
    two = truncate(torch.tensor([LOGITS, LOGITS]), torch.tensor([2, 0]), torch.tensor([0.55, 0.8]))
    assert torch.isfinite(two).tolist() == [[False, False, False, True], [False, True, True, True]]


def test_a_batch_gives_each_row_what_it_gets_alone() -> None:
    rows = [
        (1.0, 0.25, 0, 1.0),
        (0.5, 0.2, 0, 1.0),
        (0.0, 0.7, 0, 1.0),
        (1.0, 0.4, 2, 1.0),
        (1.0, 0.0, 2, 0.55),
    ]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(rows), 50, generator=g) * 3  # [B, V]
    c = choose_tokens(
        logits,
        torch.tensor([r[0] for r in rows]),
        torch.tensor([r[2] for r in rows]),
        torch.tensor([r[3] for r in rows]),
        torch.tensor([r[1] for r in rows], dtype=torch.float64),
    )
    for i, (temperature, u, k, p) in enumerate(rows):
        alone = choose_tokens(
            logits[i : i + 1],
            torch.tensor([temperature]),
            torch.tensor([k]),
            torch.tensor([p]),
            torch.tensor([u], dtype=torch.float64),
        )
        assert int(alone.tokens[0]) == int(c.tokens[i])
        assert float(alone.logprobs[0]) == float(c.logprobs[i])
        assert float(alone.sampler_logprobs[0]) == float(c.sampler_logprobs[i])


def test_truncated_sampling_follows_the_truncated_distribution() -> None:
    """20000 draws of one top-k / top-p row against its renormalised distribution: every kept token
    within 4.5 standard errors, and no other token drawn."""
    g = torch.Generator().manual_seed(1)
    n, V = 20000, 12
    logits = (torch.randn(V, generator=g) * 2).expand(n, V)  # [n, V] the same row n times
    p = torch.softmax(logits[0] / 0.7, -1).double()  # [V]
    top = p.argsort(descending=True)[:5]  # top-k 5, then top-p 0.8 of their mass
    keep = top[: int((p[top].cumsum(0) - p[top] < 0.8 * p[top].sum()).sum())]
    assert 2 <= len(keep) < 5  # top-p really cuts into the top-k, so the test means something
    want = torch.zeros(V, dtype=torch.float64)
    want[keep] = p[keep] / p[keep].sum()
    c = choose_tokens(
        logits.contiguous(),
        torch.full((n,), 0.7),
        torch.full((n,), 5),
        torch.full((n,), 0.8),
        torch.rand(n, generator=g, dtype=torch.float64),
    )
    got = torch.bincount(c.tokens, minlength=V).double() / n
    assert got[want == 0].sum() == 0
    se = (want * (1 - want) / n).sqrt()
    assert ((got - want).abs() <= 4.5 * se).all(), (got, want)
    assert torch.allclose(c.sampler_logprobs.double().exp(), want[c.tokens], atol=1e-5)


def test_two_level_cdf_picks_the_token_of_the_whole_vocabulary_cdf() -> None:
    """inverse_cdf against one float64 CDF over the whole vocabulary: a vocabulary of several blocks
    and a ragged last one, tokens of probability 0 (top-k cuts, and a whole block of them), tiny
    ones, and uniforms at block edges and near 1."""
    g = torch.Generator().manual_seed(2)
    S, V = 64, 5 * BLOCK + 37
    logp = (torch.randn(S, V, generator=g) * 4).log_softmax(-1)  # [S, V]
    logp[:, BLOCK : 2 * BLOCK] = float("-inf")  # a block without mass
    logp[::2, -50:] = float("-inf")  # the vocabulary's end without mass on half of the rows
    logp[1, 7] = -40.0  # probability 4e-18
    u = torch.rand(S, generator=g, dtype=torch.float64)
    u[:4] = torch.tensor([0.0, 1 - 1e-12, 0.5, 1 - 1e-16], dtype=torch.float64)
    cdf = logp.double().exp().cumsum(-1)  # [S, V]
    # an edge: exactly the mass of the first block, so the first token of the next block with mass
    u[4] = float(cdf[4, BLOCK - 1] / cdf[4, -1])
    want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp_max(V - 1)
    got = inverse_cdf(logp, u)
    # the same tokens (the two sums round differently, which could move a draw within ~1e-16 of a
    # token's edge; none of these is)
    assert got.tolist() == want.tolist()
    assert torch.isfinite(logp.gather(1, got[:, None])).all()  # never a token of probability 0
    assert int(got[1]) == int(logp[1].isfinite().nonzero().max())  # u near 1: the last token with mass


def test_a_truncated_row_draws_the_token_of_its_whole_vocabulary_cdf() -> None:
    """choose_tokens draws a top-k / top-p row among its candidates only: the same tokens as
    inverse_cdf over `truncate`'s whole-vocabulary distribution, and their log-probs under it, for
    top-k alone, top-p alone (every token a candidate), both, and uniforms near 0 and 1."""
    g = torch.Generator().manual_seed(3)
    S, V = 96, 3 * BLOCK + 11
    logits = torch.randn(S, V, generator=g) * 3  # [S, V]
    temps = torch.full((S,), 0.7)
    top_k = torch.tensor([50, 0, 7, 1] * (S // 4))
    top_p = torch.tensor([1.0, 0.9, 0.6, 1.0] * (S // 4))
    u = torch.rand(S, generator=g, dtype=torch.float64)
    u[:8] = torch.tensor([0.0, 0.0, 0.0, 0.0, 1 - 1e-12, 1 - 1e-12, 1 - 1e-16, 0.5], dtype=torch.float64)
    c = choose_tokens(logits, temps, top_k, top_p, u)
    sampler = truncate(torch.log_softmax(logits / 0.7, -1), top_k, top_p)  # [S, V]
    want = inverse_cdf(sampler, u)
    assert c.tokens.tolist() == want.tolist()
    torch.testing.assert_close(c.sampler_logprobs, sampler.gather(1, want[:, None])[:, 0], rtol=0, atol=1e-6)
    assert (c.tokens[3::4] == logits[3::4].argmax(-1)).all()  # top-k 1: the most likely token
