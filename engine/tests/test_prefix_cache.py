"""Shared-prefix KV reuse (prefix_cache.py, sampler.py): sampling with reuse equals sampling without
it, through joins, leaves and evictions; caches are per adapter and per weights; the LRU trie."""

from __future__ import annotations

import pytest
import torch
from helpers import PARITY_TOL, add_policy, ppo_data

from marft_engine.engine import Engine
from marft_engine.prefix_cache import BLOCK, SHARED_LEVELS, Hit, PrefixCache, shared_in_batch
from marft_engine.schemas import (
    BaseCreate,
    Completion,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    OptimStepRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)

# tiny:llama: 2 layers x (keys + values) x 2 heads x 16 x 4 bytes = 512 bytes a token, 8 KiB a block
BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * BLOCK


@pytest.fixture(scope="module")
def twin() -> Engine:
    """Two copies of one base, without and with a prefix cache of 6 blocks, each with the same
    two policies."""
    e = Engine(device="cpu", max_batch=64)
    for name, mb in [("off", 0.0), ("on", 6 * BLOCK_BYTES / 2**20)]:
        e.create_base(BaseCreate(name=name, source="tiny:llama", seed=0, prefix_cache_mb=mb, dtype="float32"))
        add_policy(e, f"A-{name}", base=name, seed=1)
        add_policy(e, f"B-{name}", base=name, seed=2)
    yield e
    e.close()


def tokens(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=g).tolist()


def calls(seed: int) -> list[list[tuple[str, list[int], int]]]:
    """Calls of (adapter, prompt, max new tokens): two headers (one of 2.5 blocks for A, one of 4 for
    B), prompts that extend them, a later turn that repeats an earlier prompt and extends it."""
    g = torch.Generator().manual_seed(seed)
    ha, hb = tokens(g, 40), tokens(g, 64)
    first = [("A", ha + tokens(g, 3 + 5 * i), 3 + 2 * i) for i in range(5)] + [("B", hb + tokens(g, 9), 7)]
    later = [("A", first[0][1] + tokens(g, 20), 6), ("B", hb + tokens(g, 2), 9), ("A", ha + tokens(g, 30), 4)]
    return [first, later[:1], later[1:], [("B", tokens(g, 50), 5)]]


def sample(e: Engine, base: str, seed: int) -> list[Completion]:
    """Submit every call before waiting, so later calls join a batch that is decoding, and rows of
    different lengths leave it at different steps."""
    futures = []
    for c, call in enumerate(calls(seed)):
        reqs = [
            SampleRequest(
                adapter=f"{a}-{base}",
                prompt_ids=p,
                sampling=SamplingParams(temperature=1.0, max_new_tokens=m),
                seed=100 * c + i,
            )
            for i, (a, p, m) in enumerate(call)
        ]
        futures.append(e.submit_sample(SampleBatch(requests=reqs)))
    return [comp for f in futures for res in f.result().results for comp in res.completions]


def test_reuse_equals_no_reuse_through_joins_leaves_and_evictions(twin: Engine) -> None:
    before = twin.stats({}).prefix_cache
    for seed in range(3):
        off, on = sample(twin, "off", seed), sample(twin, "on", seed)
        for x, y in zip(off, on, strict=True):
            assert x.response_ids == y.response_ids
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=PARITY_TOL)
    st = twin.stats({}).prefix_cache
    assert st.hits - before.hits >= 3 * 6  # headers shared within the first call and across calls
    assert st.evictions > before.evictions  # 6 blocks cannot hold two headers and their extensions
    assert st.bytes <= st.budget_bytes == 6 * BLOCK_BYTES
    assert st.prefill_tokens < st.prompt_tokens


def test_reused_logprobs_match_a_forward_pass(twin: Engine) -> None:
    comps = sample(twin, "on", 7)
    prompts = [p for call in calls(7) for _, p, _ in call]
    adapters = [a for call in calls(7) for a, _, _ in call]
    for a, p, c in zip(adapters, prompts, comps, strict=True):
        f = twin.forward(ForwardRequest(adapter=f"{a}-on", data=[Datum(tokens=p + c.response_ids)]))
        got = torch.tensor(f.results[0].logprobs[len(p) :])
        assert torch.allclose(got, torch.tensor(c.logprobs), atol=PARITY_TOL)


def test_a_later_turn_reuses_all_of_the_earlier_prompt(twin: Engine) -> None:
    """Token-granular: a prompt that extends an earlier one by a few tokens reuses every token of it,
    not just its whole blocks, and samples what the twin without a cache samples."""
    g = torch.Generator().manual_seed(21)
    first = tokens(g, 2 * BLOCK + 5)
    later = first + tokens(g, 4)

    def run(base: str, prompt: list[int]) -> Completion:
        req = SampleRequest(adapter=f"A-{base}", prompt_ids=prompt, sampling=SamplingParams(max_new_tokens=3))
        return twin.sample(SampleBatch(requests=[req], seed=5)).results[0].completions[0]

    run("on", first)
    # the prompt again (all of it cached but the last token, which a one-token step computes), then
    # the prompt and a few tokens more
    for prompt, reused in [(first, len(first) - 1), (later, len(first))]:
        before = twin.stats({}).prefix_cache.hit_tokens
        on, off = run("on", prompt), run("off", prompt)
        assert twin.stats({}).prefix_cache.hit_tokens - before == reused
        assert on.response_ids == off.response_ids
        assert torch.allclose(torch.tensor(on.logprobs), torch.tensor(off.logprobs), atol=PARITY_TOL)


def test_caches_are_per_adapter_and_per_weights(twin: Engine) -> None:
    g = torch.Generator().manual_seed(11)
    prompt = tokens(g, 3 * BLOCK + 5)

    def hits(adapter: str) -> int:
        before = twin.stats({}).prefix_cache.hits
        req = SampleRequest(adapter=adapter, prompt_ids=prompt, sampling=SamplingParams(max_new_tokens=2))
        twin.sample(SampleBatch(requests=[req], seed=0))
        return twin.stats({}).prefix_cache.hits - before

    assert hits("A-on") == 0
    assert hits("A-on") == 1  # the same adapter reuses its prompt
    assert hits("B-on") == 0  # another adapter never does
    for name in ("A-on", "A-off"):  # new weights: A's cache is stale, B's is not
        twin.forward_backward(ForwardBackwardRequest(adapter=name, loss="ppo", data=ppo_data(twin, name, 3)))
        twin.optim_step(OptimStepRequest(adapter=name))
    assert hits("A-on") == 0 and hits("B-on") == 1
    off, on = sample(twin, "off", 9), sample(twin, "on", 9)  # and what A samples follows its new weights
    for x, y in zip(off, on, strict=True):
        assert x.response_ids == y.response_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=PARITY_TOL)


def kv(n: int, value: float) -> torch.Tensor:
    """One layer [layers=1, H=1, n, D=2] whose column j holds value + j (so a hit's columns can be
    checked)."""
    return (value + torch.arange(n, dtype=torch.float32)).view(1, 1, n, 1).expand(1, 1, n, 2).clone()


TOKEN_BYTES = 2 * 2 * 4  # keys + values, D = 2, fp32


def test_lru_evicts_leaves_and_keeps_chains_whole() -> None:
    c = PrefixCache(budget=5 * BLOCK * TOKEN_BYTES)  # five blocks of 1 x 16 x 2 keys + values
    a = list(range(3 * BLOCK + 3))
    c.insert("k", a, Hit(), kv(len(a), 1.0), kv(len(a), -1.0))
    assert len(c) == 4 and c.bytes == len(a) * TOKEN_BYTES  # three whole blocks and a's last 3 tokens
    hit = c.lookup("k", a, len(a) - 1)
    assert [n.tokens for n in hit.chain] == [tuple(a[i * BLOCK : (i + 1) * BLOCK]) for i in range(3)]
    assert hit.tail is not None and hit.tail.tokens == tuple(a[3 * BLOCK :]) and hit.extra == 2
    assert hit.tokens == len(a) - 1  # a hit leaves the last token to compute
    k, v = hit.kv()
    assert torch.equal(k[0, 0, :, 0], 1.0 + torch.arange(len(a) - 1.0))
    assert torch.equal(v[0, 0, :, 1], -1.0 + torch.arange(len(a) - 1.0))
    assert c.lookup("k", a, 3 * BLOCK - 1).tokens == 3 * BLOCK - 1  # part of the third block
    assert c.lookup("other key", a, len(a)).tokens == 0
    b = a[: 2 * BLOCK] + [999] * (3 * BLOCK)  # shares two blocks, then three of its own
    prefix = c.lookup("k", b, len(b) - 1)
    assert prefix.tokens == 2 * BLOCK and prefix.tail is None
    c.insert("k", b, prefix, kv(3 * BLOCK, 2.0), kv(3 * BLOCK, -2.0))
    # six blocks and 3 tokens over a budget of five blocks: the least recently used leaves go, a's
    # last tokens and then its third block (a leaf once they are gone)
    assert len(c) == 5 and c.evictions == 2 and c.bytes == 5 * BLOCK * TOKEN_BYTES
    assert c.lookup("k", a, len(a)).tokens == 2 * BLOCK and c.lookup("k", b, len(b)).tokens == 5 * BLOCK
    got = c.lookup("k", b, len(b))
    assert all(
        float(n.k[0, 0, 0, 0]) == (1.0 + 16 * i if i < 2 else 2.0 + 16 * (i - 2))
        for i, n in enumerate(got.chain)
    )
    c.prune({"another"})
    assert len(c) == 0 and c.bytes == 0 and c.roots == {}


def test_hits_are_token_granular() -> None:
    c = PrefixCache(budget=2**20)
    h = list(range(BLOCK + 4))  # a header that ends 4 tokens into its second block
    p = h + [7, 8, 9]
    c.insert("k", p, Hit(), kv(len(p), 0.0), kv(len(p), 0.0))
    assert len(c) == 2  # a whole block, and the 7 tokens after it
    q = h + [5, 6]
    hit = c.lookup("k", q, len(q) - 1)
    assert hit.tokens == len(h) and hit.extra == 4  # the header, from the partial block's first 4 tokens
    assert torch.equal(hit.kv()[0][0, 0, :, 0], torch.arange(len(h), dtype=torch.float32))
    c.insert("k", q, hit, kv(2, 100.0), kv(2, 100.0))  # the tokens after the hit: 5, 6
    assert len(c) == 3  # a second partial block beside the first: they part after the header
    longer = q + [1, 2]
    hit = c.lookup("k", longer, len(longer) - 1)
    assert hit.tokens == len(q) and hit.extra == 6  # all of q, the earlier prompt
    assert hit.kv()[0][0, 0, :, 0].tolist() == list(range(len(h))) + [100.0, 101.0]
    shorter = h + [5]
    c.insert("k", shorter, c.lookup("k", shorter, len(shorter) - 1), kv(1, 0.0), kv(1, 0.0))
    assert len(c) == 3  # q's partial block starts with it: nothing new
    c.insert("k", longer, c.lookup("k", longer, len(longer) - 1), kv(2, 0.0), kv(2, 0.0))
    assert len(c) == 3 and c.lookup("k", longer + [3], len(longer)).tokens == len(longer)  # replaces q's
    full = h + list(range(100, 112))  # fills the second block
    c.insert("k", full, c.lookup("k", full, len(full) - 1), kv(12, 0.0), kv(12, 0.0))
    assert len(c) == 4 and c.lookup("k", full + [0], len(full)).chain[-1].tokens == tuple(full[BLOCK:])
    assert c.lookup("k", [0, 1, 2, 50], 3).tokens == 3  # from the first block


def test_shared_in_batch_names_the_shared_prefixes_in_levels() -> None:
    h = list(range(2 * BLOCK))
    p1, p2 = h + [1] * BLOCK + [5], h + [1] * BLOCK + [6]  # share three blocks
    p3 = h + [2] * 5  # shares two with them
    p4 = [7] * (3 * BLOCK)  # shares nothing
    got = shared_in_batch([("k", p1, 0), ("k", p2, 0), ("k", p3, 0), ("k", p4, 0), ("j", p1, 0)])
    assert got == [[("k", h)], [("k", h + [1] * BLOCK)]]  # the second extends the first; "j" is alone
    assert shared_in_batch([("k", p1, 3 * BLOCK), ("k", p2, 3 * BLOCK)]) == []  # already cached
    assert shared_in_batch([("k", p1, 2 * BLOCK), ("k", p2, 2 * BLOCK), ("k", p3, 2 * BLOCK)]) == [
        [("k", h + [1] * BLOCK)]
    ]
    # token-granular: prompts that share 20 tokens; 10 tokens are worth a pass only for three prompts
    assert shared_in_batch([("k", h[:20] + [1], 0), ("k", h[:20] + [2], 0)]) == [[("k", h[:20])]]
    assert shared_in_batch([("k", h[:10] + [1], 0), ("k", h[:10] + [2], 0)]) == []
    three = [("k", h[:10] + [i], 0) for i in range(3)]
    assert shared_in_batch(three) == [[("k", h[:10])]]
    # nested sharing deeper than SHARED_LEVELS: the deepest levels are not prefilled apart
    nested = [("k", [0] * (20 * d) + [100 + d], 0) for d in range(1, SHARED_LEVELS + 3)]
    assert shared_in_batch(nested) == [[("k", [0] * (20 * d))] for d in range(1, SHARED_LEVELS + 1)]
