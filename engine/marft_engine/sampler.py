"""Continuous-batching sampler: one decode loop per base, on one thread, with a KV cache.

Each `sample` call becomes rows (one per completion) queued for its base. Between decode steps the
loop admits queued rows: it prefills their prompts (each distinct prompt once, then copies the cache
for its n samples), left-pads the running cache and the newcomers' cache to a common length, and
concatenates them, so requests from concurrent HTTP calls share one batch. Every row carries its own
position ids, adapter (PEFT `adapter_names`, "__base__" = bare base), sampling parameters and seeded
generator, so a row's tokens do not depend on which other rows share its batch. Finished rows leave
the batch at once, and cache columns that only padding still uses are dropped.

On a CPU, a bf16 base decodes under bf16 autocast with its KV cache (`Base.cache_dtype`) and
attention in fp32 (`use_decode_attention`): CPU attention kernels are several times slower in bf16 for a one-token
query, while the weight matmuls, which dominate, are faster. The decode cache grows into spare room
(`SlackLayer`) instead of being re-concatenated at every step.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import lora_batch
from .errors import EngineError, bad_request
from .schemas import (
    Completion,
    SampleBatch,
    SampleResponse,
    SampleResult,
    SamplingParams,
)

if TYPE_CHECKING:
    from .engine import Base, Engine

log = logging.getLogger("marft_engine")

BASE_ADAPTER = "__base__"
T = TypeVar("T")


@dataclass
class Job:
    """One sample call: its rows finish in any order; the future resolves when all have."""

    requests: list[tuple[list[int], str, int]]  # (prompt ids, adapter, adapter version) per request
    completions: list[list[Completion | None]]
    remaining: int
    future: concurrent.futures.Future[SampleResponse]
    started: float
    tokens: int = 0


@dataclass
class Row:
    job: Job
    req: int  # request index in the job
    k: int  # sample index within the request
    prompt: list[int]
    adapter: str
    params: SamplingParams
    generator: torch.Generator | None  # None for greedy
    ignore_eos: bool
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    text: str = ""


@dataclass
class Running:
    """The decode batch of one base: rows, their KV cache ([B, H, L, D] per layer), padding mask [B, L].

    The cache object lives as long as the batch's membership does; it is rebuilt only when rows join
    or leave (rebuilding copies every layer)."""

    rows: list[Row]
    cache: DynamicCache
    mask: torch.Tensor  # [B, L] 1 = real token
    pos: torch.Tensor  # [B] position id of the next token fed

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return _kv(self.cache)


SLACK = 64  # cache positions allocated ahead; a decode step copies the cache once every SLACK steps


class SlackLayer(DynamicLayer):
    """A cache layer that appends into spare room. Why: `DynamicLayer` concatenates, which copies the
    whole layer's cache at every decode step (a fifth of a CPU decode step at a few hundred tokens).
    `keys` / `values` are views [B, H, L, D] of buffers [B, H, L + room, D]."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.dtype = dtype or keys.dtype  # the copy below casts
        self._place(keys, values)

    def _place(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        B, H, L, D = keys.shape
        self._kbuf = keys.new_empty((B, H, L + SLACK, D), dtype=self.dtype)
        self._vbuf = values.new_empty((B, H, L + SLACK, values.shape[-1]), dtype=self.dtype)
        self._kbuf[:, :, :L] = keys
        self._vbuf[:, :, :L] = values
        self.keys, self.values = self._kbuf[:, :, :L], self._vbuf[:, :, :L]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.keys.shape[-2]
        m = n + key_states.shape[-2]
        if m > self._kbuf.shape[-2]:
            self._place(self.keys, self.values)
        self._kbuf[:, :, n:m] = key_states  # cast to the cache's dtype if they differ
        self._vbuf[:, :, n:m] = value_states
        self.keys, self.values = self._kbuf[:, :, :m], self._vbuf[:, :, :m]
        return self.keys, self.values


def _cache(kv: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype | None = None) -> DynamicCache:
    """A decode cache over per-layer (keys, values) [B, H, L, D], in `dtype` (default: theirs)."""
    cache = DynamicCache()
    cache.layers = [SlackLayer(k, v, dtype) for k, v in kv]
    cache.layer_class_to_replicate = None
    return cache


def _attention_in_cache_dtype(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """SDPA in the dtype of the values: fp32 when decoding from an fp32 cache under bf16 autocast
    (autocast would otherwise run it in bf16), bf16 in prefill and training passes as autocast does
    (there rotary embeddings may have promoted queries and keys to fp32, values are bf16). With a
    mask (always, in the sampler) grouped-query heads are shared by SDPA instead of copied per step,
    as Hugging Face's sdpa path does for masked attention."""
    dt = value.dtype
    with torch.autocast(query.device.type, enabled=False):
        if attention_mask is None:  # the causal cases: Hugging Face's own handling
            out, _ = sdpa_attention_forward(
                module,  # type: ignore[arg-type]
                query.to(dt),
                key.to(dt),
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                **kwargs,  # type: ignore[arg-type]
            )
            return out.to(query.dtype), None
        out = F.scaled_dot_product_attention(
            query.to(dt),
            key.to(dt),
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )  # [B, H, T, D]
    return out.transpose(1, 2).contiguous().to(query.dtype), None


AttentionInterface.register("marft_sdpa", _attention_in_cache_dtype)
AttentionMaskInterface.register("marft_sdpa", sdpa_mask)


def use_decode_attention(model: PreTrainedModel) -> None:
    """For a bf16 base on a CPU: attention in the cache's dtype (see the module docstring)."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation("marft_sdpa")


def _row_seed(entropy: list[int]) -> int:
    """A well-mixed 63-bit seed per row from (seed, [request index,] sample index)."""
    return int(np.random.SeedSequence([abs(x) for x in entropy]).generate_state(1, dtype=np.uint64)[0] >> 1)


class Sampler:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.cond = threading.Condition()
        self.queued: dict[str, deque[Row]] = {}  # base name -> rows waiting for admission
        self.running: dict[str, Running] = {}
        self.calls: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()  # see call()
        self.stopped = False
        self.peak_batch = 0  # most rows decoded together so far (observability, tests)
        self.thread = threading.Thread(target=self._loop, name="marft-compute", daemon=True)
        self.thread.start()

    def close(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(timeout=10)

    # ------------------------------------------------------------------------------------------------
    # admission of a call

    def _prompt_ids(self, base: Base, i: int, req: object) -> list[int]:
        from .schemas import SampleRequest

        assert isinstance(req, SampleRequest)
        if (req.messages is None) == (req.prompt_ids is None):
            raise bad_request(f"requests[{i}]: give exactly one of messages and prompt_ids")
        if req.messages is not None:
            if not req.messages:
                raise bad_request(f"requests[{i}].messages: empty")
            msgs = [m.model_dump() for m in req.messages]
            try:
                out = base.tokenizer.apply_chat_template(
                    msgs, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            except (ValueError, TypeError) as e:  # e.g. a tokenizer without a chat template
                raise bad_request(
                    f"requests[{i}].messages: cannot apply the chat template of base {base.name!r}: {e}"
                ) from e
            ids = [int(t) for t in (out["input_ids"] if isinstance(out, dict) else out)]
            field_name = "messages"
        else:
            assert req.prompt_ids is not None
            ids = list(req.prompt_ids)
            field_name = "prompt_ids"
            if not ids:
                raise bad_request(f"requests[{i}].prompt_ids: empty")
            for j, t in enumerate(ids):
                if not 0 <= t < base.vocab_size:
                    raise bad_request(
                        f"requests[{i}].prompt_ids[{j}]: token id {t} is outside the vocabulary [0, {base.vocab_size})"
                    )
        if len(ids) >= base.context_length:
            raise bad_request(
                f"requests[{i}].{field_name}: the prompt is {len(ids)} tokens; the context of base "
                f"{base.name!r} is {base.context_length}"
            )
        return ids

    def submit(self, body: SampleBatch) -> concurrent.futures.Future[SampleResponse]:
        eng = self.engine
        future: concurrent.futures.Future[SampleResponse] = concurrent.futures.Future()
        prepared = []
        seed = body.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())  # from the global RNG (checkpointed)
        for i, req in enumerate(body.requests):
            base, adapter = eng.resolve(req.adapter, req.base, f"requests[{i}].")
            if adapter is not None and adapter.kind != "policy":
                raise bad_request(
                    f"requests[{i}].adapter: {req.adapter!r} is a critic; sample needs a policy"
                )
            ids = self._prompt_ids(base, i, req)
            for s in req.sampling.stop:
                if not s:
                    raise bad_request(f"requests[{i}].sampling.stop: empty stop string")
            version = adapter.version if adapter is not None else 0
            prepared.append((base, ids, req, version))
        job = Job(
            requests=[(ids, req.adapter, v) for _, ids, req, v in prepared],
            completions=[[None] * req.sampling.n for _, _, req, _ in prepared],
            remaining=sum(req.sampling.n for _, _, req, _ in prepared),
            future=future,
            started=time.perf_counter(),
        )
        rows_by_base: dict[str, list[Row]] = {}
        for i, (base, ids, req, _) in enumerate(prepared):
            sp = req.sampling
            for k in range(sp.n):
                gen = None
                if sp.temperature > 0:
                    gen = torch.Generator(device=base.device)  # multinomial needs one on the logits device
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
                        ignore_eos=sp.ignore_eos,
                    )
                )
        with self.cond:
            for name, rows in rows_by_base.items():
                self.queued.setdefault(name, deque()).extend(rows)
            self.cond.notify_all()
        return future

    # ------------------------------------------------------------------------------------------------
    # the loop

    def call(self, fn: Callable[[], T]) -> T:
        """Run fn on this loop's thread, between decode steps, and return its result (see
        engine.on_compute_thread). On the loop's own thread it just runs."""
        if threading.current_thread() is self.thread:
            return fn()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self.cond:
            if self.stopped:
                raise RuntimeError("the engine is closed")
            self.calls.append((fn, future))
            self.cond.notify_all()
        return future.result()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while (
                    not self.stopped and not self.calls and not any(self.queued.values()) and not self.running
                ):
                    self.cond.wait()
                calls = list(self.calls)
                self.calls.clear()
                stopped = self.stopped
            for fn, future in calls:  # calls first: they wait for a decode step at most
                if stopped:
                    future.set_exception(RuntimeError("the engine is closed"))
                    continue
                try:
                    future.set_result(fn())
                except BaseException as e:  # the caller gets it, as if it had run fn itself
                    future.set_exception(e)
            if stopped:
                return
            with self.cond:
                names = sorted(set(self.running) | {n for n, q in self.queued.items() if q})
            for name in names:
                try:
                    base = self.engine.bases.get(name)
                    if base is None:
                        raise RuntimeError(f"base {name!r} is gone")
                    self._admit(base)
                    self._step(base)
                except Exception as e:  # a failure fails the calls in that batch, not the engine
                    log.exception("sampling on base %s failed", name)
                    self._fail(name, e)

    def _fail(self, name: str, exc: Exception) -> None:
        rows = list(self.running.pop(name).rows) if name in self.running else []
        with self.cond:
            q = self.queued.pop(name, deque())
        for r in [*rows, *q]:
            if not r.job.future.done():
                r.job.future.set_exception(exc)

    def _model_call(self, base: Base, **kw: object) -> torch.Tensor:
        with torch.no_grad(), self.engine.autocast(base):
            names = kw.pop("adapter_names")
            assert isinstance(names, list)
            if base.peft is None:
                out = base.hf(**kw)
            else:
                with lora_batch.rows(base.hf, names) as direct:
                    out = base.hf(**kw) if direct else base.peft(**kw, adapter_names=names)
        return out.logits[:, -1].float()  # [B, V]

    def _admit(self, base: Base) -> None:
        run = self.running.get(base.name)
        room = self.engine.max_batch - (len(run.rows) if run else 0)
        with self.cond:
            q = self.queued.get(base.name)
            new: list[Row] = []
            while q and len(new) < room:
                r = q.popleft()
                if r.adapter != BASE_ADAPTER and r.adapter not in self.engine.adapters:
                    r.job.future.set_exception(
                        bad_request(f"adapter {r.adapter!r} was deleted before sampling")
                    )
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

    def _prefill(self, base: Base, run: Running | None, new: list[Row]) -> None:
        # Prefill each distinct (request, prompt) once, left-padded; its n samples then share the cache.
        keys: dict[tuple[int, int], int] = {}
        uniq: list[Row] = []
        which: list[int] = []
        for r in new:
            key = (id(r.job), r.req)
            if key not in keys:
                keys[key] = len(uniq)
                uniq.append(r)
            which.append(keys[key])
        P = len(uniq)
        L = max(len(r.prompt) for r in uniq)
        ids = torch.full((P, L), base.pad_id, dtype=torch.long)
        mask = torch.zeros((P, L), dtype=torch.long)
        for i, r in enumerate(uniq):
            n = len(r.prompt)
            ids[i, L - n :] = torch.tensor(r.prompt)
            mask[i, L - n :] = 1
        pos = (mask.cumsum(-1) - 1).clamp_min(0)  # [P, L] per-row positions, pads at 0
        dev = base.device
        cache = DynamicCache()
        logits = self._model_call(
            base,
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=pos.to(dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            adapter_names=[r.adapter for r in uniq],
        )
        sel = torch.tensor(which, device=dev)
        kv = _kv(cache)
        if len(uniq) != len(new):  # n > 1: copy each prompt's cache rows for its samples
            kv = [(k.index_select(0, sel), v.index_select(0, sel)) for k, v in kv]
        cache = _cache(kv, base.cache_dtype)  # a CPU bf16 base decodes from an fp32 cache
        mask = mask.to(dev).index_select(0, sel)
        logits = logits.index_select(0, sel)
        npos = torch.tensor([len(r.prompt) for r in new], device=dev)
        self._take(base, new, logits)
        joined = Running(rows=new, cache=cache, mask=mask, pos=npos)
        if run is not None:
            joined = _concat(run, joined)
        self.running[base.name] = self._drop_finished(base, joined)
        if not self.running[base.name].rows:
            del self.running[base.name]

    def _step(self, base: Base) -> None:
        run = self.running.get(base.name)
        if run is None:
            return
        gone = [r for r in run.rows if r.adapter != BASE_ADAPTER and r.adapter not in self.engine.adapters]
        if gone:  # deleted mid-decode: fail those calls rather than silently continue on the bare base
            for r in gone:
                if not r.job.future.done():
                    r.job.future.set_exception(
                        EngineError(409, "conflict", f"adapter {r.adapter!r} was deleted while sampling")
                    )
                r.finish = "length"
            run = self._drop_finished(base, run)
            if not run.rows:
                del self.running[base.name]
                return
            self.running[base.name] = run
        dev = base.device
        B = len(run.rows)
        self.peak_batch = max(self.peak_batch, B)
        ids = torch.tensor([[r.out[-1]] for r in run.rows], device=dev)  # [B, 1]
        mask = torch.cat([run.mask, torch.ones((B, 1), dtype=run.mask.dtype, device=dev)], dim=1)  # [B, L+1]
        logits = self._model_call(
            base,
            input_ids=ids,
            attention_mask=mask,
            position_ids=run.pos[:, None],
            past_key_values=run.cache,
            use_cache=True,
            adapter_names=[r.adapter for r in run.rows],
        )
        run.mask = mask
        run.pos = run.pos + 1
        self._take(base, run.rows, logits)
        run = self._drop_finished(base, run)
        if run.rows:
            self.running[base.name] = run
        else:
            del self.running[base.name]

    # ------------------------------------------------------------------------------------------------
    # token choice and bookkeeping

    def _take(self, base: Base, rows: list[Row], logits: torch.Tensor) -> None:
        """Choose one token per row from logits [B, V]; record log-probs; mark finished rows."""
        B, V = logits.shape
        temps = torch.tensor(
            [r.params.temperature if r.params.temperature > 0 else 1.0 for r in rows], device=logits.device
        )
        logp = F.log_softmax(logits / temps[:, None], dim=-1)  # [B, V] the tempered policy
        chosen: list[int] = [0] * B
        sampler_lp: list[float] = [0.0] * B
        for i, r in enumerate(rows):
            sp = r.params
            if sp.temperature == 0:  # greedy: the sampler is a point mass, log-prob 0
                chosen[i] = int(torch.argmax(logits[i]))
                continue
            row = logp[i]  # [V]
            if sp.top_k > 0 or sp.top_p < 1.0:
                k = min(sp.top_k, V) if sp.top_k > 0 else V
                vals, idx = torch.topk(row, k)  # [k] sorted descending
                if sp.top_p < 1.0:
                    probs = vals.exp()
                    before = probs.cumsum(0) - probs  # mass strictly above each token
                    vals = vals.masked_fill(before >= sp.top_p * probs.sum(), float("-inf"))
                trunc = vals - torch.logsumexp(vals, 0)  # [k] renormalised
                j = int(torch.multinomial(trunc.exp(), 1, generator=r.generator))
                chosen[i] = int(idx[j])
                sampler_lp[i] = float(trunc[j])
            else:
                chosen[i] = int(torch.multinomial(row.exp(), 1, generator=r.generator))
                sampler_lp[i] = float(row[chosen[i]])
        picked = logp.gather(1, torch.tensor(chosen, device=logits.device)[:, None]).squeeze(1).tolist()
        eos = set(base.eos_ids)
        for i, r in enumerate(rows):
            t = chosen[i]
            r.out.append(t)
            r.logprobs.append(float(picked[i]))
            r.sampler_logprobs.append(sampler_lp[i])
            if t in eos and not r.ignore_eos:
                r.finish = "eos"
            elif r.params.stop and self._stopped(base, r):
                r.finish = "stop"
            elif len(r.out) >= r.params.max_new_tokens or len(r.prompt) + len(r.out) >= base.context_length:
                r.finish = "length"

    def _stopped(self, base: Base, r: Row) -> bool:
        text = base.tokenizer.decode(r.out, skip_special_tokens=False)
        for s in r.params.stop:
            # only look where the newest token could have completed a match
            if s in text:
                return True
        return False

    def _drop_finished(self, base: Base, run: Running) -> Running:
        done = [i for i, r in enumerate(run.rows) if r.finish is not None]
        if not done:
            return run
        for i in done:
            self._complete(base, run.rows[i])
        keep = [i for i, r in enumerate(run.rows) if r.finish is None]
        if not keep:
            return Running(rows=[], cache=_cache([]), mask=run.mask[:0], pos=run.pos[:0])
        sel = torch.tensor(keep, device=run.mask.device)
        mask = run.mask.index_select(0, sel)
        # columns that are padding for every remaining row can go
        first = int((mask.sum(0) > 0).nonzero()[0])
        kv = [
            (k.index_select(0, sel)[:, :, first:], v.index_select(0, sel)[:, :, first:]) for k, v in run.kv()
        ]
        return Running(
            rows=[run.rows[i] for i in keep],
            cache=_cache(kv),
            mask=mask[:, first:],
            pos=run.pos.index_select(0, sel),
        )

    def _complete(self, base: Base, r: Row) -> None:
        ids = r.out
        if r.finish == "eos":
            text = base.tokenizer.decode(ids[:-1], skip_special_tokens=False)
        else:
            text = base.tokenizer.decode(ids, skip_special_tokens=False)
            if r.finish == "stop":
                cut = min((text.find(s) for s in r.params.stop if s in text), default=len(text))
                text = text[:cut]
        job = r.job
        job.completions[r.req][r.k] = Completion(
            response_ids=list(ids),
            logprobs=r.logprobs,
            sampler_logprobs=r.sampler_logprobs,
            text=text,
            finish_reason=r.finish,  # type: ignore[arg-type]
        )
        job.tokens += len(ids)
        self.engine.counters.tokens_sampled += len(ids)
        job.remaining -= 1
        if job.remaining == 0 and not job.future.done():
            results = [
                SampleResult(
                    prompt_ids=p, adapter=a, adapter_version=v, completions=[c for c in cs if c is not None]
                )
                for (p, a, v), cs in zip(job.requests, job.completions, strict=True)
            ]
            job.future.set_result(
                SampleResponse(
                    results=results, tokens_sampled=job.tokens, seconds=time.perf_counter() - job.started
                )
            )


def _concat(a: Running, b: Running) -> Running:
    """Join two decode batches: left-pad the shorter cache so both have the same length."""
    La, Lb = a.mask.shape[1], b.mask.shape[1]
    L = max(La, Lb)

    def lpad(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
        if n == 0:
            return x
        shape = list(x.shape)
        shape[dim] = n
        return torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim=dim)

    kv = [
        (
            torch.cat([lpad(ka, L - La, 2), lpad(kb, L - Lb, 2)]),
            torch.cat([lpad(va, L - La, 2), lpad(vb, L - Lb, 2)]),
        )
        for (ka, va), (kb, vb) in zip(a.kv(), b.kv(), strict=True)
    ]
    mask = torch.cat([lpad(a.mask, L - La, 1), lpad(b.mask, L - Lb, 1)])
    return Running(rows=a.rows + b.rows, cache=_cache(kv), mask=mask, pos=torch.cat([a.pos, b.pos]))


def _kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]
