"""Speculative decoding with prompt-lookup drafts (speculative.py): the drafts, the exactness of the
verification, and sampling with drafts against sampling without, through joins and leaves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import PARITY_TOL

from marft_engine.engine import Engine
from marft_engine.sampler import Row, Sampler
from marft_engine.schemas import (
    Completion,
    Datum,
    ForwardRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)
from marft_engine.speculative import STEP_POSITIONS, PromptLookup, verify_drafts
from marft_engine.token_choice import truncate


def test_prompt_lookup_drafts_what_followed_the_latest_occurrence() -> None:
    look = PromptLookup([1, 2, 3, 4, 1, 2, 5])
    assert look.draft(3) == []  # (2, 5) has not occurred before
    look.extend([9, 1, 2])
    assert look.draft(3) == [5, 9, 1]  # the latest (1, 2) before the end was followed by 5 9 1
    assert look.draft(1) == [5]
    assert look.draft(0) == []
    look.extend([7])
    assert look.draft(4) == []
    assert PromptLookup([3]).draft(2) == []  # fewer tokens than a match needs
    loop = PromptLookup([4, 5, 4, 5])
    assert loop.draft(5) == [4, 5]  # a loop drafts its continuation, up to the tokens there are


def verify_many(
    logits: torch.Tensor, temperature: float, top_k: int, draft: int, n: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n], accepted [n]) of n independent verifications of one position."""
    g = torch.Generator().manual_seed(seed)
    v = verify_drafts(
        logits.expand(n, -1),
        torch.full((n,), temperature),
        torch.full((n,), top_k),
        torch.ones(n),
        torch.full((n,), draft),
        torch.rand(n, generator=g, dtype=torch.float64),
        torch.rand(n, generator=g, dtype=torch.float64),
    )
    return v.tokens, v.accepted


@pytest.mark.parametrize("draft", [-1, 0, 2, 4])  # none, the likeliest, a less likely, one outside top-k
def test_verified_tokens_are_drawn_from_the_sampling_distribution(draft: int) -> None:
    logits = torch.tensor([[2.0, 0.5, 1.0, -1.0, 1.5]])
    p = truncate(F.log_softmax(logits / 0.7, -1), torch.tensor([3]), torch.tensor([1.0])).exp()[0]
    n = 40_000
    tokens, accepted = verify_many(logits, 0.7, 3, draft, n, seed=draft + 10)
    freq = torch.bincount(tokens, minlength=5).double() / n
    # 5 standard errors of a frequency of 40,000 draws is at most 0.0125
    assert torch.allclose(freq, p.double(), atol=0.0125), (freq, p)
    if draft >= 0:
        assert abs(accepted.double().mean().item() - p[draft].item()) < 0.0125
        assert bool((tokens[accepted] == draft).all())
    else:
        assert not accepted.any()


def test_verification_reports_the_policy_and_sampler_logprobs_and_greedy_takes_the_argmax() -> None:
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    best = logits.argmax(-1)
    drafts = torch.tensor([int(best[0]), (int(best[1]) + 1) % 11, -1, 3, 3, -1])
    temps = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.5, 1.3])
    top_k = torch.tensor([0, 0, 0, 0, 4, 0])
    u = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    v = verify_drafts(logits, temps, top_k, torch.ones(6), drafts, u, u.flip(0))
    assert v.tokens[:3].tolist() == best[:3].tolist()  # greedy: the argmax, drafted or not
    assert v.accepted[:3].tolist() == [True, False, False]
    policy = F.log_softmax(logits / torch.where(temps == 0, 1.0, temps)[:, None], -1)
    assert torch.allclose(v.logprobs, policy.gather(1, v.tokens[:, None])[:, 0])
    sampler = policy.clone()
    sampler[4:5] = truncate(policy[4:5], top_k[4:5], torch.ones(1))
    want = sampler.gather(1, v.tokens[:, None])[:, 0].masked_fill(temps == 0, 0.0)
    assert torch.allclose(v.sampler_logprobs, want)


REPEAT = [5, 6, 7, 8, 9, 10] * 4  # a prompt that prompt lookup drafts from at once


def prompts(seed: int) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(seed)
    rand = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (7, 15, 4)]
    return [(REPEAT, 12), (rand[0] + REPEAT[:9], 9), (rand[1], 5), (REPEAT + rand[2] + REPEAT[:4], 14)]


def sample(e: Engine, draft: int, temperature: float, seed: int, top_k: int = 0) -> list[Completion]:
    """Two calls, the second submitted while the first decodes, rows of several lengths; adapters A,
    B and the bare base; rows with drafts beside rows without (the third prompt finds no match). With
    top_k, the even rows sample from their top_k tokens, the odd ones from all."""
    futures = []
    for c in range(2):
        reqs = [
            SampleRequest(
                adapter=["A", "B", "__base__"][i % 3],
                base="b",
                prompt_ids=p,
                sampling=SamplingParams(
                    temperature=temperature,
                    top_k=top_k * (1 - i % 2),
                    max_new_tokens=m + c,
                    draft_tokens=draft,
                    ignore_eos=True,
                ),
                seed=10 * seed + 3 * c + i,
            )
            for i, (p, m) in enumerate(prompts(seed + c))
        ]
        futures.append(e.submit_sample(SampleBatch(requests=reqs)))
    return [x for f in futures for r in f.result().results for x in r.completions]


def test_greedy_with_drafts_equals_greedy_without_in_fewer_steps(engine: Engine) -> None:
    for seed in range(3):
        before = engine.stats({})
        plain = sample(engine, 0, 0.0, seed)
        mid = engine.stats({})
        drafted = sample(engine, 4, 0.0, seed)
        after = engine.stats({})
        for x, y in zip(plain, drafted, strict=True):
            assert x.response_ids == y.response_ids
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=PARITY_TOL)
        accepted = after.accepted_drafts - mid.accepted_drafts
        assert 0 < accepted <= after.drafted_tokens - mid.drafted_tokens
        # a row emits one token a step and one more per accepted draft: the rows' steps fall by those
        assert (after.decode_rows - mid.decode_rows) == (mid.decode_rows - before.decode_rows) - accepted


def oracle_drafts(monkeypatch: pytest.MonkeyPatch, table: dict[tuple[int, ...], list[int]]) -> None:
    """Rows draft from a known continuation of their prompt instead of prompt lookup (which the
    random tiny model gives little to accept): the verification, the holes and the walk get drafts
    that are accepted, and, where the continuation is altered, rejected."""

    def draft(self: Sampler, base: object, r: Row, most: int) -> list[int]:
        cont = table.get(tuple(r.prompt), [])
        k = min(r.params.draft_tokens, most, r.params.max_new_tokens - len(r.out) - 1)
        return cont[len(r.out) : len(r.out) + max(k, 0)]

    monkeypatch.setattr(Sampler, "_draft", draft)


def test_sampled_with_drafts_logprobs_match_a_forward_pass_and_repeat_with_the_seed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = 5
    calls = [(i, p, m + c) for c in range(2) for i, (p, m) in enumerate(prompts(seed + c))]
    greedy = sample(engine, 0, 0.0, seed)
    # each row's greedy continuation, every fifth token altered: top-1 rows accept up to there
    table = {
        tuple(p): [t if j % 5 != 4 else (t + 1) % 256 for j, t in enumerate(g.response_ids)]
        for (_, p, _), g in zip(calls, greedy, strict=True)
    }
    oracle_drafts(monkeypatch, table)
    before = engine.stats({})
    first = sample(engine, 6, 1.0, seed, top_k=1)
    mid = engine.stats({})
    assert mid.accepted_drafts - before.accepted_drafts >= 20
    assert mid.drafted_tokens - before.drafted_tokens > mid.accepted_drafts - before.accepted_drafts
    again = sample(engine, 6, 1.0, seed, top_k=1)
    assert [c.response_ids for c in first] == [c.response_ids for c in again]
    for (i, p, m), comp, g in zip(calls, first, greedy, strict=True):
        assert len(comp.response_ids) == m  # max_new_tokens, not more (ignore_eos)
        adapter = ["A", "B", "__base__"][i % 3]
        f = engine.forward(
            ForwardRequest(adapter=adapter, base="b", data=[Datum(tokens=p + comp.response_ids)])
        )
        got = torch.tensor(f.results[0].logprobs[len(p) :])
        assert torch.allclose(got, torch.tensor(comp.logprobs), atol=PARITY_TOL)
        if i % 2:  # no truncation: the sampler's distribution is the policy
            assert torch.allclose(got, torch.tensor(comp.sampler_logprobs), atol=PARITY_TOL)
        else:  # top-1: the greedy tokens, through the sampling path; the token was certain
            assert comp.response_ids == g.response_ids
            assert comp.sampler_logprobs == [0.0] * len(comp.response_ids)


def test_a_large_batch_decodes_without_drafts(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(0, 256, (6,), generator=g).tolist() for _ in range(STEP_POSITIONS // 2 + 1)]
    oracle_drafts(monkeypatch, {tuple(p): [7] * 20 for p in ps})  # always a draft, mostly rejected

    def drafted(n: int) -> int:
        before = engine.stats({}).drafted_tokens
        sp = SamplingParams(temperature=0.0, max_new_tokens=6, draft_tokens=8, ignore_eos=True)
        engine.sample(
            SampleBatch(requests=[SampleRequest(adapter="A", prompt_ids=p, sampling=sp) for p in ps[:n]])
        )
        return engine.stats({}).drafted_tokens - before

    # more rows than half the step budget: not even one draft each fits, so none is fed
    assert drafted(len(ps)) == 0
    # 4 rows: up to 8 drafts each (4 x 9 positions <= STEP_POSITIONS), on each of their 5 steps
    assert 0 < drafted(4) <= 4 * 8 * 5
