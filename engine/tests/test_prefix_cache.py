"""Shared-prefix KV reuse (prefix_cache.py, sampler.py): sampling with reuse equals sampling without
it, through joins, leaves and evictions; caches are per adapter and per weights; the LRU trie."""

from __future__ import annotations

import pytest
import torch
from helpers import PARITY_TOL, add_policy, ppo_data

from marft_engine.engine import Engine
from marft_engine.prefix_cache import BLOCK, PrefixCache, shared_in_batch
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


def kv(n: int, value: float) -> list[torch.Tensor]:
    return [torch.full((1, n, 2), value)]  # one layer [H=1, n, D=2]


def test_lru_evicts_leaves_and_keeps_chains_whole() -> None:
    c = PrefixCache(budget=5 * 2 * 2 * BLOCK * 4)  # five blocks of 1 x 16 x 2 keys + values
    a = list(range(3 * BLOCK + 3))
    c.insert("k", a, [], kv(len(a), 1.0), kv(len(a), -1.0))
    assert len(c) == 3 and c.bytes == 3 * 2 * 2 * BLOCK * 4
    chain = c.lookup("k", a, len(a) - 1)
    assert [n.tokens for n in chain] == [tuple(a[i * BLOCK : (i + 1) * BLOCK]) for i in range(3)]
    assert len(c.lookup("k", a, 3 * BLOCK - 1)) == 2  # a hit leaves the last token to compute
    assert c.lookup("other key", a, len(a)) == []
    b = a[: 2 * BLOCK] + [999] * (3 * BLOCK)  # shares two blocks, then three of its own
    prefix = c.lookup("k", b, len(b) - 1)
    assert len(prefix) == 2
    c.insert("k", b, prefix, kv(3 * BLOCK, 2.0), kv(3 * BLOCK, -2.0))
    # six blocks over a budget of five: the least recently used is a's third block, a leaf
    assert len(c) == 5 and c.evictions == 1
    assert len(c.lookup("k", a, len(a))) == 2 and len(c.lookup("k", b, len(b))) == 5
    got = c.lookup("k", b, len(b))
    assert all(float(n.k[0, 0, 0, 0]) == (1.0 if i < 2 else 2.0) for i, n in enumerate(got))
    c.prune({"another"})
    assert len(c) == 0 and c.bytes == 0 and c.roots == {}


def test_shared_in_batch_names_the_deepest_shared_prefixes() -> None:
    h = list(range(2 * BLOCK))
    p1, p2 = h + [1] * BLOCK + [5], h + [1] * BLOCK + [6]  # share three blocks
    p3 = h + [2] * 5  # shares two with them
    p4 = [7] * (3 * BLOCK)  # shares nothing
    got = shared_in_batch([("k", p1, 0), ("k", p2, 0), ("k", p3, 0), ("k", p4, 0), ("j", p1, 0)])
    assert got == [("k", h + [1] * BLOCK)]  # covers p3's two blocks too; key "j" is alone
    assert shared_in_batch([("k", p1, 3), ("k", p2, 3)]) == []  # already cached
