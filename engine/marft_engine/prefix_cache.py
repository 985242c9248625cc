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
given its parent chain, [layers, H, n, D] each (H = key/value heads, D = head size, n = its tokens):
a whole block (n = BLOCK), or a prompt's last, partial block (n < BLOCK, always a leaf). A hit is
token-granular, as SGLang's radix cache: a chain of whole blocks, then the first tokens that one more
node shares with the prompt (a prompt's first j tokens have the same keys and values whatever
follows them). Why: a system prompt or header rarely ends on a block's edge, and on short prompts
the up to BLOCK - 1 tokens a whole-block hit leaves are a large part of them.

A hit's nodes are touched leaf first, so a node is always more recently used than its descendants:
the least recently used node is a leaf, and evicting from that end keeps every cached chain whole.
The cache holds at most `budget` bytes.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

BLOCK = 16  # tokens per cached block (vLLM's default block size)
# A prefix shared within a batch is prefilled first (its own pass) only where that saves this many
# tokens of prefill; a pass per level of nesting, at most SHARED_LEVELS (shared_in_batch).
MIN_SHARED_SAVING = BLOCK
SHARED_LEVELS = 3

# A trie level: the nodes after one chain, by first token, then by their tokens (partial hits look
# only at the nodes that start with the prompt's next token).
Level = dict[int, dict[tuple[int, ...], "Node"]]


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...]  # BLOCK tokens, or fewer in a prompt's last block (then a leaf)
    parent: Node | None
    k: torch.Tensor  # [layers, H, len(tokens), D]
    v: torch.Tensor  # [layers, H, len(tokens), D]
    children: Level = field(default_factory=dict)
    key: Hashable = None

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


@dataclass
class Hit:
    """A prompt's cached prefix: whole blocks `chain`, then the first `extra` tokens of `tail` (a
    child of the chain's last node, or a root, that starts like the rest of the prompt)."""

    chain: list[Node] = field(default_factory=list)
    tail: Node | None = None
    extra: int = 0

    @property
    def tokens(self) -> int:
        return len(self.chain) * BLOCK + self.extra

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The hit's keys and values, [layers, H, tokens, D] each."""
        nodes = [*self.chain, *([self.tail] if self.tail is not None else [])]
        n = [BLOCK] * len(self.chain) + ([self.extra] if self.tail is not None else [])
        k = torch.cat([node.k[:, :, :m] for node, m in zip(nodes, n, strict=True)], dim=2)
        v = torch.cat([node.v[:, :, :m] for node, m in zip(nodes, n, strict=True)], dim=2)
        return k, v


def right_aligned(hits: list[Hit], device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The hits' keys and values side by side for a prefill pass: [layers, P, H, C, D] each (C: the
    longest hit), hit i's right-aligned in the C columns, zeros before it; None where none has a token."""
    kvs = [hit.kv() if hit.tokens else None for hit in hits]  # [layers, H, c, D] each
    C = max(hit.tokens for hit in hits)
    if C == 0:
        return None
    like = next(k for k, _ in filter(None, kvs))
    L, H, _, D = like.shape
    k, v = (like.new_zeros((L, len(hits), H, C, D), device=device) for _ in range(2))
    for i, x in enumerate(kvs):
        if x is not None:
            c = x[0].shape[2]
            k[:, i, :, C - c :], v[:, i, :, C - c :] = x
    return k, v


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of a and b."""
    n, m = 0, min(len(a), len(b))
    while n < m and a[n] == b[n]:
        n += 1
    return n


def _put(level: Level, node: Node) -> None:
    level.setdefault(node.tokens[0], {})[node.tokens] = node


def _drop(level: Level, node: Node) -> None:
    same = level[node.tokens[0]]
    del same[node.tokens]
    if not same:
        del level[node.tokens[0]]


class PrefixCache:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.roots: dict[Hashable, Level] = {}
        self.lru: OrderedDict[int, Node] = OrderedDict()  # id(node) -> node, least recent first
        self.bytes = 0
        # observability (/v1/stats): prompts that reused a cached prefix, prompts that did not, the
        # tokens reused, blocks evicted for room
        self.hits = self.misses = self.hit_tokens = self.evictions = 0

    def __len__(self) -> int:
        return len(self.lru)

    def lookup(self, key: Hashable, tokens: Sequence[int], limit: int) -> Hit:
        """The longest cached prefix of `tokens`, at most `limit` tokens (a prefill must compute at
        least the prompt's last token, for its logits)."""
        hit = Hit()
        level = self.roots.get(key, {})
        limit = min(limit, len(tokens))
        while True:
            lo = len(hit.chain) * BLOCK
            rest = tokens[lo:limit]
            if not rest:
                break
            same = level.get(rest[0], {})
            b = tuple(rest[:BLOCK])
            node = same.get(b) if len(b) == BLOCK else None
            if node is not None:
                hit.chain.append(node)
                level = node.children
                continue
            for cand in same.values():  # no whole block: the node that shares most of the rest
                n = _common(cand.tokens, rest)
                if n > hit.extra:
                    hit.tail, hit.extra = cand, n
            break
        self._touch([*hit.chain, *([hit.tail] if hit.tail is not None else [])])
        return hit

    def count(self, hit: Hit) -> None:
        """Record one prompt's lookup in the statistics."""
        if hit.tokens:
            self.hits += 1
            self.hit_tokens += hit.tokens
        else:
            self.misses += 1

    def insert(
        self,
        key: Hashable,
        tokens: Sequence[int],
        hit: Hit,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Cache `tokens` after `hit` (its cached prefix, as `lookup` gave it): their whole blocks,
        and the last, partial one. k, v: [layers, H, len(tokens) - hit.tokens, D], the keys and
        values of the tokens after the hit. Then evict down to the budget."""
        chain = hit.chain
        if any(id(n) not in self.lru for n in chain):
            return  # evicted since the lookup (another prompt's insert): nothing to hang new blocks on
        if hit.tail is not None:  # the tail's shared tokens start the first new block
            k = torch.cat([hit.tail.k[:, :, : hit.extra], k], dim=2)
            v = torch.cat([hit.tail.v[:, :, : hit.extra], v], dim=2)
        start = len(chain) * BLOCK  # k, v's first column is this token
        level = chain[-1].children if chain else self.roots.setdefault(key, {})
        parent = chain[-1] if chain else None
        path = list(chain)
        for lo in range(start, len(tokens), BLOCK):
            b = tuple(tokens[lo : lo + BLOCK])
            node = level.get(b[0], {}).get(b)
            if node is None:
                if len(b) < BLOCK:  # a partial block that a cached node already starts with adds nothing
                    node = next((s for s in level.get(b[0], {}).values() if s.tokens[: len(b)] == b), None)
            if node is None:
                # partial siblings this block starts with are now redundant (leaves: dropped whole)
                for s in [s for s in level.get(b[0], {}).values() if len(s.tokens) < len(b)]:
                    if b[: len(s.tokens)] == s.tokens:
                        self._remove(s)
                node = Node(
                    tokens=b,
                    parent=parent,
                    k=k[:, :, lo - start : lo - start + len(b)].clone(),  # [layers, H, len(b), D]
                    v=v[:, :, lo - start : lo - start + len(b)].clone(),
                    key=key,
                )
                _put(level, node)
                self.lru[id(node)] = node
                self.bytes += node.nbytes
            path.append(node)
            if len(b) < BLOCK:
                break
            parent, level = node, node.children
        self._touch(path)
        self._evict()

    def prune(self, live: set[Hashable]) -> None:
        """Drop every entry whose key is not in `live` (an adapter deleted or whose weights changed)."""
        for key in [k for k in self.roots if k not in live]:
            stack = [n for same in self.roots.pop(key).values() for n in same.values()]
            while stack:
                node = stack.pop()
                stack.extend(n for same in node.children.values() for n in same.values())
                del self.lru[id(node)]
                self.bytes -= node.nbytes

    def _touch(self, nodes: list[Node]) -> None:
        for node in reversed(nodes):  # leaf first: ancestors end up more recent (module docstring)
            self.lru.move_to_end(id(node))

    def _remove(self, node: Node) -> None:
        """Take a leaf out of the trie."""
        assert not node.children, "only leaves are removed"
        siblings = node.parent.children if node.parent is not None else self.roots[node.key]
        _drop(siblings, node)
        if node.parent is None and not siblings:
            del self.roots[node.key]
        del self.lru[id(node)]
        self.bytes -= node.nbytes

    def _evict(self) -> None:
        while self.bytes > self.budget and self.lru:
            node = next(iter(self.lru.values()))
            self._remove(node)
            self.evictions += 1


def shared_in_batch(
    prompts: list[tuple[Hashable, Sequence[int], int]],
) -> list[list[tuple[Hashable, list[int]]]]:
    """Prefixes that two or more of a batch's prompts (key, tokens, cached tokens) share beyond what
    is cached, in levels: prefilling each level in turn, before the prompts, lets every prompt (and
    every deeper shared prefix) reuse them ("in flight" sharing). A level's prefixes each extend one
    of the level before. A prefix is taken where it saves MIN_SHARED_SAVING tokens of prefill (its
    prompts less one, times its tokens beyond the shared prefix it extends); at most SHARED_LEVELS.

    The candidates are the branch points of the prompts' trie: sorted, each pair of neighbours shares
    exactly the prefix where they part (capped so that each prompt keeps its last token to compute)."""
    groups: dict[Hashable, list[tuple[tuple[int, ...], int]]] = {}
    for key, tokens, cached in prompts:
        groups.setdefault(key, []).append((tuple(tokens), cached))
    levels: list[list[tuple[Hashable, list[int]]]] = [[] for _ in range(SHARED_LEVELS)]
    for key, group in groups.items():
        group.sort()
        ts = [t for t, _ in group]
        # parts[i]: the prefix length prompts i and i + 1 share [len(group) - 1]
        parts = [min(_common(a, b), len(a) - 1, len(b) - 1) for a, b in itertools.pairwise(ts)]
        found: dict[tuple[int, ...], tuple[int, int]] = {}  # prefix -> (prompts sharing it, cached)
        for i, n in enumerate(parts):
            if n <= group[i][1] or ts[i][:n] in found:
                continue
            lo, hi = i, i  # the run of neighbour pairs that share at least n tokens
            while lo > 0 and parts[lo - 1] >= n:
                lo -= 1
            while hi + 1 < len(parts) and parts[hi + 1] >= n:
                hi += 1
            found[ts[i][:n]] = (hi - lo + 2, group[i][1])
        kept: list[tuple[tuple[int, ...], int]] = []  # (prefix, level), shorter first
        for p in sorted(found, key=len):
            sharing, cached = found[p]
            under = next(((q, d) for q, d in reversed(kept) if p[: len(q)] == q), None)
            level = under[1] + 1 if under else 0
            saved = (sharing - 1) * (len(p) - max(cached, len(under[0]) if under else 0))
            if saved >= MIN_SHARED_SAVING and level < SHARED_LEVELS:
                kept.append((p, level))
                levels[level].append((key, list(p)))
    return [lv for lv in levels if lv]
