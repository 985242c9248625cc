"""Shared-prefix KV reuse for the sampler: a least-recently-used cache of prompt keys and values.

Why: every episode of a rollout sends each agent the same system prompt and header, an agent's
later turns repeat the start of its earlier ones, and tasks share long contexts (few-shot examples,
a code task's statement). Prefilling each prompt from scratch recomputes those tokens every time.
Here the keys and values of a prompt's leading tokens are kept, and a later prompt that starts with
the same tokens prefills only the rest (sampler.py).

What can be shared: the keys and values of a token depend on the tokens before it and on the
weights that computed them. A LoRA adapter on any layer changes that layer's output, and so the keys
and values of every later layer: a cache is shared only by requests of the same adapter at the same
weights, never across adapters. Entries are keyed by (adapter name, weights epoch), where the epoch
changes whenever the adapter's weights may have (`lora_batch.weights_epoch`); entries of an older
epoch are dropped (`prune`).

Layout: per key a trie of blocks of BLOCK tokens. A node holds the keys and values of one block
given its parent chain, [layers, H, BLOCK, D] each (H = key/value heads, D = head size). Only whole
blocks are cached, so a hit covers a multiple of BLOCK tokens. A chain is touched leaf first, so a
node is always more recently used than its descendants: the least recently used node is a leaf, and
evicting from that end keeps every cached chain whole. The cache holds at most `budget` bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

BLOCK = 16  # tokens per cached block (vLLM's default block size)


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...]  # the block's BLOCK tokens
    parent: Node | None
    k: torch.Tensor  # [layers, H, BLOCK, D]
    v: torch.Tensor  # [layers, H, BLOCK, D]
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    key: Hashable = None

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


def _blocks(tokens: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[j * BLOCK : (j + 1) * BLOCK]) for j in range(n)]


class PrefixCache:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.roots: dict[Hashable, dict[tuple[int, ...], Node]] = {}
        self.lru: OrderedDict[int, Node] = OrderedDict()  # id(node) -> node, least recent first
        self.bytes = 0
        # observability (/v1/stats): prompts that reused a cached prefix, prompts that did not, the
        # tokens reused, blocks evicted for room
        self.hits = self.misses = self.hit_tokens = self.evictions = 0

    def __len__(self) -> int:
        return len(self.lru)

    def lookup(self, key: Hashable, tokens: Sequence[int], limit: int) -> list[Node]:
        """The longest cached chain of whole blocks that `tokens` starts with, covering at most
        `limit` tokens (a prefill must compute at least the prompt's last token, for its logits)."""
        chain: list[Node] = []
        level = self.roots.get(key, {})
        for b in _blocks(tokens, min(limit, len(tokens)) // BLOCK):
            node = level.get(b)
            if node is None:
                break
            chain.append(node)
            level = node.children
        self._touch(chain)
        return chain

    def count(self, chain: list[Node]) -> None:
        """Record one prompt's lookup in the statistics."""
        if chain:
            self.hits += 1
            self.hit_tokens += len(chain) * BLOCK
        else:
            self.misses += 1

    def insert(
        self,
        key: Hashable,
        tokens: Sequence[int],
        chain: list[Node],
        k: list[torch.Tensor],
        v: list[torch.Tensor],
    ) -> None:
        """Cache the whole blocks of `tokens` after `chain` (its cached prefix, as `lookup` gave it).
        k, v: per layer [H, len(tokens) - len(chain) * BLOCK, D], the keys and values of the tokens
        after the chain. Then evict down to the budget."""
        done = len(chain)
        level = chain[-1].children if chain else self.roots.setdefault(key, {})
        parent = chain[-1] if chain else None
        path = list(chain)
        for j, b in enumerate(_blocks(tokens, len(tokens) // BLOCK)[done:]):
            node = level.get(b)
            if node is None:
                lo, hi = j * BLOCK, (j + 1) * BLOCK
                node = Node(
                    tokens=b,
                    parent=parent,
                    k=torch.stack([x[:, lo:hi] for x in k]),  # [layers, H, BLOCK, D], a copy
                    v=torch.stack([x[:, lo:hi] for x in v]),
                    key=key,
                )
                level[b] = node
                self.lru[id(node)] = node
                self.bytes += node.nbytes
            path.append(node)
            parent, level = node, node.children
        self._touch(path)
        self._evict()

    def prune(self, live: set[Hashable]) -> None:
        """Drop every entry whose key is not in `live` (an adapter deleted or whose weights changed)."""
        for key in [k for k in self.roots if k not in live]:
            stack = list(self.roots.pop(key).values())
            while stack:
                node = stack.pop()
                stack.extend(node.children.values())
                del self.lru[id(node)]
                self.bytes -= node.nbytes

    def _touch(self, chain: list[Node]) -> None:
        for node in reversed(chain):  # leaf first: ancestors end up more recent (module docstring)
            self.lru.move_to_end(id(node))

    def _evict(self) -> None:
        while self.bytes > self.budget and self.lru:
            _, node = self.lru.popitem(last=False)
            assert not node.children, "the least recently used node is a leaf"
            siblings = node.parent.children if node.parent is not None else self.roots[node.key]
            del siblings[node.tokens]
            if node.parent is None and not siblings:
                del self.roots[node.key]
            self.bytes -= node.nbytes
            self.evictions += 1


def shared_in_batch(prompts: list[tuple[Hashable, Sequence[int], int]]) -> list[tuple[Hashable, list[int]]]:
    """Prefixes of whole blocks that two or more of a batch's prompts (key, tokens, cached blocks)
    share beyond what is cached, longest first and none a prefix of another: prefilling these once
    before the prompts lets every prompt of the batch reuse them ("in flight" sharing)."""
    counts: dict[tuple[Hashable, tuple[int, ...]], int] = {}
    usable = []
    for key, tokens, cached in prompts:
        n = (len(tokens) - 1) // BLOCK  # a hit must leave the last token to compute
        usable.append(n)
        for j in range(cached + 1, n + 1):
            p = (key, tuple(tokens[: j * BLOCK]))
            counts[p] = counts.get(p, 0) + 1
    best: set[tuple[Hashable, tuple[int, ...]]] = set()
    for (key, tokens, cached), n in zip(prompts, usable, strict=True):
        for j in range(n, cached, -1):  # the deepest block prefix another prompt shares
            p = (key, tuple(tokens[: j * BLOCK]))
            if counts[p] >= 2:
                best.add(p)
                break
    chosen = sorted(best, key=lambda p: -len(p[1]))
    out: list[tuple[Hashable, list[int]]] = []
    for key, toks in chosen:
        if not any(k == key and o[: len(toks)] == list(toks) for k, o in out):
            out.append((key, list(toks)))
    return out
