"""Continuous-batching sampler: one decode loop over every base, stepped by the compute thread
(compute.py) between engine calls, with a slot KV cache (kv_cache.py).

Each `sample` call becomes rows (one per completion) queued for its base. Before each decode step the
loop admits queued rows: it prefills their prompts (each distinct prompt once; its n samples share
that prefill) and copies each row's prompt cache into a free slot of the running batch, so requests
from concurrent HTTP calls share one batch. Every row carries its own position ids, adapter (PEFT
`adapter_names`, "__base__" = bare base), sampling parameters and seeded generator, so a row's
tokens do not depend on which other rows share its batch. A finished row leaves the batch at once:
the last row moves into its slot. Joining and leaving copy one row's cache, never the batch's
(`SlotLayer`), and a decode step computes the live rows only. Each step chooses every row's token
at once (token_choice.py) and checks its stop strings on the text the token can have completed
(stops.py).

On a CPU, a bf16 base decodes under bf16 autocast with a bf16 KV cache (`Base.cache_dtype`: fp32
without the engine's attention kernel) and attention in fp32 (see precision.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from transformers import DynamicCache

from . import fused_decode, lora_batch, unpad
from .errors import BadRequest, Conflict
from .kv_cache import KV, Pair, Running, Spans, layers_of
from .prefix_cache import Hit, PrefixCache, right_aligned, shared_in_batch
from .registry import BASE_ADAPTER, Base, Registry, at_positions
from .schemas import (
    Completion,
    PrefixCacheStats,
    SampleBatch,
    SampleRequest,
    SampleResponse,
    SampleResult,
    SamplingParams,
)
from .speculative import STEP_POSITIONS, PromptLookup, take
from .stops import stop_completed, text_before_stop
from .token_choice import choose_tokens

log = logging.getLogger("marft_engine")


@dataclass
class Job:
    """One sample call: its rows finish in any order; the future resolves when all have."""

    requests: list[tuple[list[int], str, int]]  # (prompt ids, adapter, adapter version) per request
    completions: list[list[Completion | None]]
    remaining: int
    future: concurrent.futures.Future[SampleResponse]
    started: float
    tokens: int = 0
    retokenized: list[list[int]] = field(default_factory=list)  # per request (SampleResult.retokenized)


@dataclass
class Row:
    job: Job
    req: int  # request index in the job
    k: int  # sample index within the request
    prompt: list[int]
    adapter: str
    params: SamplingParams
    generator: torch.Generator | None  # None for greedy
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)
    finish: Literal["stop", "eos", "length"] | None = None
    lookup: PromptLookup | None = None  # its drafts, where its request sets draft_tokens


def _row_seed(entropy: list[int]) -> int:
    """A well-mixed 63-bit seed per row from (seed, [request index,] sample index)."""
    return int(np.random.SeedSequence([abs(x) for x in entropy]).generate_state(1, dtype=np.uint64)[0] >> 1)


class Sampler:
    """The decode loop, as the compute thread's background work (see compute.py): every method runs
    on the compute thread, so the queues and batches need no lock."""

    def __init__(self, registry: Registry, max_batch: int) -> None:
        self.registry = registry
        self.max_batch = max_batch
        self.queued: dict[str, deque[Row]] = {}  # base name -> rows waiting for admission
        self.running: dict[str, Running[Row]] = {}
        self.peak_batch = 0  # most rows decoded together so far (observability, tests)
        self.tokens_sampled = 0
        self.decode_steps = 0  # decode steps, and the rows they computed (mean batch = rows / steps)
        self.decode_rows = 0
        self.prefill_seconds = 0.0  # wall time admitting rows (prefill, first token) and decoding:
        self.decode_seconds = 0.0  # where sampling's time goes
        self.drafted_tokens = 0  # speculative decoding: drafted tokens fed, and those accepted
        self.accepted_drafts = 0
        self.prefix: dict[str, PrefixCache] = {}  # base name -> its prefix cache (bases that have one)
        self.prompt_tokens = 0  # prompt tokens admitted, and those of them prefilled (not reused)
        self.prefill_tokens = 0

    # ------------------------------------------------------------------------------------------------
    # admission of a call

    def submit(self, body: SampleBatch) -> concurrent.futures.Future[SampleResponse]:
        """Queue a call's rows (every request is checked first, so a bad one queues nothing); the
        future resolves when all of them are done."""
        future: concurrent.futures.Future[SampleResponse] = concurrent.futures.Future()
        prepared: list[tuple[Base, list[int], SampleRequest, int]] = []  # (base, prompt, request, version)
        retokenized: list[list[int]] = []
        seed = body.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())  # from the global RNG (checkpointed)
        for i, req in enumerate(body.requests):
            base, adapter = self.registry.resolve(req.adapter, req.base, f"requests[{i}].")
            if adapter is not None and adapter.kind != "policy":
                raise BadRequest(f"requests[{i}].adapter: {req.adapter!r} is a critic; sample needs a policy")
            ids, retok = base.request_prompt(i, req)
            retokenized.append(retok)
            for s in req.sampling.stop:
                if not s:
                    raise BadRequest(f"requests[{i}].sampling.stop: empty stop string")
            version = adapter.version if adapter is not None else 0
            prepared.append((base, ids, req, version))
        job = Job(
            requests=[(ids, req.adapter, v) for _, ids, req, v in prepared],
            completions=[[None] * req.sampling.n for _, _, req, _ in prepared],
            remaining=sum(req.sampling.n for _, _, req, _ in prepared),
            future=future,
            started=time.perf_counter(),
            retokenized=retokenized,
        )
        rows_by_base: dict[str, list[Row]] = {}
        for i, (base, ids, req, _) in enumerate(prepared):
            sp = req.sampling
            for k in range(sp.n):
                gen = None
                if sp.temperature > 0:
                    gen = torch.Generator(device=base.device)  # it draws on the logits' device
                    gen.manual_seed(_row_seed([req.seed, k] if req.seed is not None else [seed, i, k]))
                rows_by_base.setdefault(base.name, []).append(
                    Row(
                        job=job,
                        req=i,
                        k=k,
                        prompt=ids,
                        adapter=req.adapter,
                        params=sp,
                        generator=gen,
                    )
                )
        for name, rows in rows_by_base.items():
            self.queued.setdefault(name, deque()).extend(rows)
        return future

    # ------------------------------------------------------------------------------------------------
    # the decode loop (stepped by the compute thread)

    def busy(self) -> bool:
        return bool(self.running) or any(self.queued.values())

    def step(self) -> None:
        """Admit waiting rows and run one decode step, on every base that has rows."""
        for name in sorted(set(self.running) | {n for n, q in self.queued.items() if q}):
            try:
                base = self.registry.bases.get(name)
                if base is None:
                    raise RuntimeError(f"base {name!r} is gone")
                t = time.perf_counter()
                self._admit(base)
                t1 = time.perf_counter()
                self._step(base)
                self.prefill_seconds += t1 - t
                self.decode_seconds += time.perf_counter() - t1
            except Exception as e:  # a failure fails the calls in that batch, not the engine
                log.exception("sampling on base %s failed", name)
                self._fail(name, e)

    def _fail(self, name: str, exc: Exception) -> None:
        rows = list(self.running.pop(name).rows) if name in self.running else []
        q = self.queued.pop(name, deque())
        for r in [*rows, *q]:
            if not r.job.future.done():
                r.job.future.set_exception(exc)

    def _model_call(
        self, base: Base, adapter_names: list[str], index: torch.Tensor | None = None, **kw: object
    ) -> torch.Tensor:
        """The last position's logits [B, V] of a pass with each row through its own adapter; with
        index, those at the flattened [B * T] positions index [M] (`Base.last_logits`)."""
        with torch.no_grad(), base.autocast():
            if (fused := fused_decode.logits(base.hf, kw, adapter_names, index)) is not None:
                return fused  # a CPU decode step of one token a row (fused_decode.py)
            if base.peft is None:
                return base.last_logits(kw, index)
            with lora_batch.rows(base.hf, adapter_names) as direct:
                if direct:
                    return base.last_logits(kw, index)
                keep = 1 if index is None else 0
                out = base.peft(**kw, adapter_names=adapter_names, logits_to_keep=keep).logits
                return at_positions(out, index).float()

    def _admit(self, base: Base) -> None:
        run = self.running.get(base.name)
        room = self.max_batch - (len(run.rows) if run else 0)
        q = self.queued.get(base.name)
        new: list[Row] = []
        while q and len(new) < room:
            r = q.popleft()
            if r.adapter != BASE_ADAPTER and r.adapter not in self.registry.adapters:
                r.job.future.set_exception(BadRequest(f"adapter {r.adapter!r} was deleted before sampling"))
                continue
            if not r.job.future.done():
                new.append(r)
        if not new:
            return
        try:
            self._prefill(base, run, new)
        except Exception as e:  # the popped rows are in no queue or batch yet: fail their calls here
            for r in new:
                if not r.job.future.done():
                    r.job.future.set_exception(e)
            raise

    def _prefill(self, base: Base, run: Running[Row] | None, new: list[Row]) -> None:
        # one adapter's rows side by side: its LoRA runs once over their tokens (lora_batch._add_runs)
        new = sorted(new, key=lambda r: r.adapter)
        # Prefill each distinct (request, prompt) once; its n samples then share the cache.
        keys: dict[tuple[int, int], int] = {}
        uniq: list[Row] = []
        which: list[int] = []
        for r in new:
            key = (id(r.job), r.req)
            if key not in keys:
                keys[key] = len(uniq)
                uniq.append(r)
            which.append(keys[key])
        prompts = [(r.adapter, r.prompt) for r in uniq]
        cache = self._prefix_cache(base)
        if cache is not None:
            cache.prune({self._cache_key(a) for a in [BASE_ADAPTER, *self.registry.adapters]})
            # Prefixes that several of these prompts share and the cache lacks: prefill each once
            # first (its logits unused), so that every prompt below reuses it.
            looked = [
                (self._cache_key(a), p, cache.lookup(self._cache_key(a), p, len(p) - 1).tokens)
                for a, p in prompts
            ]
            for level in shared_in_batch(looked):  # each level extends the one before (prefix_cache.py)
                self._prefill_prompts(base, [(key[0], toks) for key, toks in level], cache)
        logits, kv, spans = self._prefill_prompts(base, prompts, cache, count=True)
        logits = logits.index_select(0, torch.tensor(which, device=base.device))
        self._take(base, new, logits)
        live = [j for j, r in enumerate(new) if r.finish is None]
        for r in new:
            if r.finish is not None:  # done at its first token (max_new_tokens 1, eos): never decoded
                self._complete(base, r)
        if live:
            if run is None:
                run = self.running[base.name] = Running(self.max_batch, base.cache_dtype)
            run.add([new[j] for j in live], kv, [which[j] for j in live], spans)

    def prefix_stats(self) -> PrefixCacheStats:
        caches = list(self.prefix.values())
        return PrefixCacheStats(
            hits=sum(c.hits for c in caches),
            misses=sum(c.misses for c in caches),
            hit_tokens=sum(c.hit_tokens for c in caches),
            prompt_tokens=self.prompt_tokens,
            prefill_tokens=self.prefill_tokens,
            bytes=sum(c.bytes for c in caches),
            budget_bytes=sum(b.prefix_cache_bytes for b in self.registry.bases.values()),
            blocks=sum(len(c) for c in caches),
            evictions=sum(c.evictions for c in caches),
        )

    def _prefix_cache(self, base: Base) -> PrefixCache | None:
        if base.prefix_cache_bytes <= 0:
            return None
        cache = self.prefix.get(base.name)
        if cache is None:
            cache = self.prefix[base.name] = PrefixCache(base.prefix_cache_bytes)
        return cache

    def _cache_key(self, adapter: str) -> tuple[str, int]:
        """Prefix-cache entries are valid for one adapter at one set of weights (prefix_cache.py)."""
        return (adapter, 0 if adapter == BASE_ADAPTER else lora_batch.weights_epoch(adapter))

    def _prefill_prompts(
        self, base: Base, prompts: list[tuple[str, list[int]]], cache: PrefixCache | None, count: bool = False
    ) -> tuple[torch.Tensor, KV, list[Spans]]:
        """Prefill prompts (adapter, ids) in one left-padded pass, each reusing the longest cached
        prefix of its adapter's (then only the rest is computed, after that prefix's keys and values).
        Returns the last position's logits [P, V], the pass's cache (per layer [P, H, C + S, D]) and
        the columns of each row that hold its prompt, in order; caches the prompts (PrefixCache.insert)."""
        hits = [cache.lookup(self._cache_key(a), p, len(p) - 1) if cache else Hit() for a, p in prompts]
        if cache is not None and count:
            for hit in hits:
                cache.count(hit)
        cached = [hit.tokens for hit in hits]
        C = max(cached)  # columns of cached keys and values before the new tokens
        rest = [len(p) - c for (_, p), c in zip(prompts, cached, strict=True)]
        S = max(rest)
        self.prefill_tokens += sum(rest)
        self.prompt_tokens += sum(len(p) for _, p in prompts)
        past = right_aligned(hits, base.device)  # [layers, P, H, C, D] each, or None
        adapters, new = [a for a, _ in prompts], [p[c:] for (_, p), c in zip(prompts, cached, strict=True)]
        with torch.no_grad(), base.autocast():  # one C++ call a layer where it applies (fused_decode.py)
            fused = fused_decode.prefill(base.hf, adapters, new, cached, past)  # None: not taken
        logits, kv = self._padded_prefill(base, adapters, new, cached, past) if fused is None else fused
        spans = [
            ([(C - c, C)] if c else []) + [(C + S - s, C + S)] for c, s in zip(cached, rest, strict=True)
        ]
        if cache is not None:
            for i, ((a, p), hit, s) in enumerate(zip(prompts, hits, rest, strict=True)):
                # [layers, H, s, D]: the tokens after the hit
                new_k = torch.stack([k[i, :, C + S - s :] for k, _ in kv])
                new_v = torch.stack([v[i, :, C + S - s :] for _, v in kv])
                cache.insert(self._cache_key(a), p, hit, new_k, new_v)
        return logits, kv, spans

    def _padded_prefill(
        self, base: Base, adapters: list[str], new: list[list[int]], cached: list[int], past: Pair | None
    ) -> tuple[torch.Tensor, KV]:
        """`_prefill_prompts`' pass through Hugging Face's forward. Row i: its cached prefix right-aligned
        in columns [C - c_i, C), its new tokens in [C + S - s_i, C + S), padding (masked) before each."""
        P, C, S = len(new), max(cached), max(len(t) for t in new)
        ids = torch.full((P, S), base.pad_id, dtype=torch.long)
        mask = torch.zeros((P, C + S), dtype=torch.long)
        pos = torch.zeros((P, S), dtype=torch.long)
        for i, (t, c) in enumerate(zip(new, cached, strict=True)):
            ids[i, S - len(t) :], pos[i, S - len(t) :] = torch.tensor(t), torch.arange(c, c + len(t))
            mask[i, C - c : C] = mask[i, C + S - len(t) :] = 1
        # over the real tokens only where it applies (unpad.py; PEFT's own per-row path takes rows)
        real = unpad.prefill(base.hf, ids, mask, pos) if lora_batch.rows_supported(base.hf) else None
        cache = DynamicCache() if real is None else unpad.PaddingCache()
        if past is not None:
            cache = type(cache)(ddp_cache_data=list(zip(past[0], past[1], strict=True)))
        kw = {"input_ids": ids, "attention_mask": mask, "position_ids": pos} if real is None else real[1]
        last = None if real is None else real[2]  # each row's last token among the real ones
        with contextlib.nullcontext() if real is None else unpad.laid_out(real[0]):
            kw = {k: v.to(base.device) for k, v in kw.items()} | {"past_key_values": cache, "use_cache": True}
            logits = self._model_call(base, adapters, last, **kw)
        return logits, layers_of(cache)

    def _step(self, base: Base) -> None:
        run = self.running.get(base.name)
        if run is None:
            return
        gone = [r for r in run.rows if r.adapter != BASE_ADAPTER and r.adapter not in self.registry.adapters]
        if gone:  # deleted mid-decode: fail those calls rather than silently continue on the bare base
            for r in gone:
                if not r.job.future.done():
                    r.job.future.set_exception(Conflict(f"adapter {r.adapter!r} was deleted while sampling"))
                r.finish = "length"
            if not self._drop_finished(base, run):
                return
        dev = base.device
        B = len(run.rows)
        self.peak_batch = max(self.peak_batch, B)
        self.decode_steps += 1
        self.decode_rows += B
        drafts = [self._draft(base, r, STEP_POSITIONS // B - 1) for r in run.rows]
        T = 1 + max(len(d) for d in drafts)  # fed tokens a row: its last one and its drafts, padded
        ids = torch.tensor(
            [[r.out[-1], *d] + [0] * (T - 1 - len(d)) for r, d in zip(run.rows, drafts, strict=True)]
        )
        mask, pos = run.step_inputs(dev, T)  # [B, L+T], [B, T]
        index = (
            None
            if T == 1
            else torch.tensor([i * T + t for i, d in enumerate(drafts) for t in range(len(d) + 1)])
        )
        logits = self._model_call(
            base,
            input_ids=ids.to(dev),
            attention_mask=mask,
            position_ids=pos,
            past_key_values=run.cache,
            use_cache=True,
            adapter_names=[r.adapter for r in run.rows],
            index=None if index is None else index.to(dev),
        )  # [B, V], or [M, V] at each row's fed tokens but its padding
        if T == 1:
            run.advance()
            self._take(base, run.rows, logits)
        else:
            kept = take(run.rows, drafts, logits, functools.partial(self._emit, base))
            run.advance(T, kept)
            self.drafted_tokens += sum(map(len, drafts))
            self.accepted_drafts += sum(kept) - len(kept)
        self._drop_finished(base, run)

    def _draft(self, base: Base, r: Row, most: int) -> list[int]:
        """The row's drafted tokens for this step, at most `most` (speculative.py): none unless it
        asks for them."""
        if not r.params.draft_tokens or most <= 0:
            return []
        if r.lookup is None:
            r.lookup = PromptLookup(r.prompt)
        r.lookup.extend(r.out[len(r.lookup.ids) - len(r.prompt) :])  # its tokens since the last step
        room = min(r.params.max_new_tokens - len(r.out), base.context_length - len(r.prompt) - len(r.out))
        return r.lookup.draft(min(r.params.draft_tokens, most, room - 1))  # the step emits one more

    # ------------------------------------------------------------------------------------------------
    # token choice and bookkeeping

    def _take(self, base: Base, rows: list[Row], logits: torch.Tensor) -> None:
        """Choose one token per row from logits [B, V]; record log-probs; mark finished rows."""
        dev = logits.device
        params = [r.params for r in rows]
        uniforms = [  # one draw per sampled row from its own generator (greedy rows have none)
            torch.rand((), generator=r.generator, device=dev, dtype=torch.float64)
            if r.generator is not None
            else torch.zeros((), device=dev, dtype=torch.float64)
            for r in rows
        ]
        choice = choose_tokens(
            logits,
            torch.tensor([p.temperature for p in params], device=dev),
            torch.tensor([p.top_k for p in params], device=dev),
            torch.tensor([p.top_p for p in params], device=dev),
            torch.stack(uniforms),
        )
        tokens, logprobs = choice.tokens.tolist(), choice.logprobs.tolist()
        for r, t, logprob, sampler_logprob in zip(
            rows, tokens, logprobs, choice.sampler_logprobs.tolist(), strict=True
        ):
            self._emit(base, r, t, logprob, sampler_logprob)

    def _emit(self, base: Base, r: Row, t: int, logprob: float, sampler_logprob: float) -> None:
        """Append a chosen token to its row; mark the row finished where the token ends it."""
        r.out.append(t)
        r.logprobs.append(logprob)
        r.sampler_logprobs.append(sampler_logprob)
        if t in base.eos_ids and not r.params.ignore_eos:
            r.finish = "eos"
        elif r.params.stop and stop_completed(
            functools.partial(base.tokenizer.decode, skip_special_tokens=False), r.out, r.params.stop
        ):
            r.finish = "stop"
        elif len(r.out) >= r.params.max_new_tokens or len(r.prompt) + len(r.out) >= base.context_length:
            r.finish = "length"

    def _drop_finished(self, base: Base, run: Running[Row]) -> bool:
        """Complete the finished rows and take them out of the batch; returns whether any row is left
        (an empty batch is dropped, and its cache with it)."""
        done = [i for i, r in enumerate(run.rows) if r.finish is not None]
        for i in done:
            self._complete(base, run.rows[i])
        run.remove(done)
        if not run.rows:
            del self.running[base.name]
        return bool(run.rows)

    def _complete(self, base: Base, r: Row) -> None:
        ids = r.out
        if r.finish == "eos":
            text = base.tokenizer.decode(ids[:-1], skip_special_tokens=False)
        else:
            text = base.tokenizer.decode(ids, skip_special_tokens=False)
            if r.finish == "stop":
                text = text_before_stop(text, r.params.stop)
        job = r.job
        job.completions[r.req][r.k] = Completion(
            response_ids=list(ids),
            logprobs=r.logprobs,
            sampler_logprobs=r.sampler_logprobs,
            text=text,
            finish_reason=r.finish,
        )
        job.tokens += len(ids)
        self.tokens_sampled += len(ids)
        job.remaining -= 1
        if job.remaining == 0 and not job.future.done():
            results = [
                SampleResult(
                    prompt_ids=p,
                    retokenized=job.retokenized[i] if i < len(job.retokenized) else [],
                    adapter=a,
                    adapter_version=v,
                    completions=[c for c in cs if c is not None],
                )
                for i, ((p, a, v), cs) in enumerate(zip(job.requests, job.completions, strict=True))
            ]
            job.future.set_result(
                SampleResponse(
                    results=results, tokens_sampled=job.tokens, seconds=time.perf_counter() - job.started
                )
            )
