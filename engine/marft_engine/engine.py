"""The engine: bases, adapters, forward / training compute and checkpoints, behind one compute lock.

Sampling lives in sampler.py (a continuous-batching decode loop on its own thread); it takes the same
lock around every decode step, so training calls and sampling interleave step by step.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import re
import resource
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import peft
import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from . import lora_batch, losses, precision
from .compute import ComputeThread, on_compute_thread
from .errors import BadRequest, Conflict, NotFound
from .models import load_source
from .schemas import (
    AdapterCreate,
    AdapterInfo,
    AdapterList,
    BaseCreate,
    BaseInfo,
    BaseList,
    CheckpointRequest,
    CheckpointResponse,
    Datum,
    EndpointStats,
    ForwardBackwardRequest,
    ForwardBackwardResponse,
    ForwardRequest,
    ForwardResponse,
    ForwardResult,
    LoraConfig,
    OptimizerConfig,
    OptimStepRequest,
    OptimStepResponse,
    SampleBatch,
    SampleResponse,
    Stats,
)

hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()

BASE_ADAPTER = "__base__"
NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
# Elements of fp32 logits one micro-batch may hold (2^25 = 128 MiB; see _micro_batches).
LOGITS_BUDGET = 2**25
# Model families whose logits are exactly lm_head(final hidden state): the loss may run the head on
# the weighted positions only (see Engine._token_scores).
PLAIN_HEAD_MODELS = frozenset({"llama", "qwen2", "qwen3", "mistral"})


@dataclass
class Base:
    name: str
    source: str
    hf: PreTrainedModel  # the HF model; PEFT injects its LoRA layers into it in place
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    # compute dtype (bf16: autocast; on CPU embeddings and norms stay fp32, see precision.py)
    dtype: torch.dtype
    context_length: int
    eos_ids: list[int]
    pad_id: int
    vocab_size: int
    num_parameters: int
    seed: int
    # logits are exactly lm_head(final hidden state): the head may run on chosen positions only
    plain_head: bool
    # dtype of the sampler's KV cache; None: as the model computes it (see precision.place)
    cache_dtype: torch.dtype | None = None
    peft: peft.PeftModel | None = None  # created with the first adapter, then holds all of them

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The context every pass of this base runs in (see precision.py)."""
        return precision.autocast(self.device, self.dtype)

    def info(self) -> BaseInfo:
        return BaseInfo(
            name=self.name,
            source=self.source,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            num_parameters=self.num_parameters,
            eos_token_ids=self.eos_ids,
            pad_token_id=self.pad_id,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
        )


@dataclass
class Adapter:
    name: str
    base: Base
    kind: str  # policy | critic
    lora: LoraConfig
    opt: OptimizerConfig
    value_head_hidden: list[int]
    params: list[torch.nn.Parameter]  # LoRA (+ value head) parameters, in a fixed order
    optimizer: torch.optim.AdamW
    value_head: torch.nn.Module | None = None
    version: int = 0
    lr: float = 0.0
    seed: int = 0

    def info(self) -> AdapterInfo:
        return AdapterInfo(
            name=self.name,
            base=self.base.name,
            kind=self.kind,  # type: ignore[arg-type]
            version=self.version,
            num_trainable_parameters=sum(p.numel() for p in self.params),
            lora=self.lora,
        )


def make_value_head(hidden_size: int, hidden: list[int], seed: int) -> torch.nn.Module:
    """MLP from the last hidden state to one scalar per position."""
    sizes = [hidden_size, *hidden, 1]
    layers: list[torch.nn.Module] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i in range(len(sizes) - 1):
            layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(torch.nn.GELU())
        head = torch.nn.Sequential(*layers)
    return head


@dataclass
class Counters:
    tokens_sampled: int = 0
    tokens_trained: int = 0
    decode_steps: int = 0  # sampler decode steps, and the rows they computed (mean batch = rows / steps)
    decode_rows: int = 0


@dataclass
class _CallStats:
    """Weighted sums over a whole forward_backward call; divided by the total weight at the end."""

    sums: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: torch.Tensor | float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(value)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    return torch.device(device)


class Engine:
    def __init__(self, device: str = "auto", max_batch: int = 64) -> None:
        self.device = resolve_device(device)
        self.device_name = str(self.device)
        self.max_batch = max_batch
        self.bases: dict[str, Base] = {}
        self.adapters: dict[str, Adapter] = {}
        self.counters = Counters()
        from .sampler import Sampler  # here to keep the import graph one-way

        self.sampler = Sampler(self)
        self.compute = ComputeThread(self.sampler)
        lora_batch.install()

    def close(self) -> None:
        self.compute.close()

    # ------------------------------------------------------------------------------------------------
    # bases and adapters

    @on_compute_thread
    def create_base(self, body: BaseCreate) -> BaseInfo:
        if not NAME_RE.match(body.name) or body.name == BASE_ADAPTER:
            raise BadRequest(f"name: {body.name!r} must match [A-Za-z0-9_-]+ and not be {BASE_ADAPTER}")
        if body.name in self.bases:
            raise Conflict(f"name: base {body.name!r} already exists")
        try:
            model, tokenizer = load_source(body.source, body.seed)
        except (OSError, ValueError) as e:  # unreadable or foreign files: the caller's source is wrong
            raise BadRequest(f"source: cannot load {body.source!r}: {e}") from e
        dtype = precision.compute_dtype(body.dtype, self.device)
        cache_dtype = precision.place(model, self.device, dtype)
        eos = tokenizer.eos_token_id
        eos_ids = sorted({int(eos)} if eos is not None else set())
        cfg_eos = model.config.eos_token_id
        if isinstance(cfg_eos, int):
            eos_ids = sorted(set(eos_ids) | {cfg_eos})
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
        base = Base(
            name=body.name,
            source=body.source,
            hf=model,
            tokenizer=tokenizer,
            device=self.device,
            dtype=dtype,
            context_length=int(getattr(model.config, "max_position_embeddings", 2048)),
            eos_ids=eos_ids,
            pad_id=int(pad),
            vocab_size=int(model.config.vocab_size),
            num_parameters=sum(p.numel() for p in model.parameters()),
            seed=body.seed,
            plain_head=model.config.model_type in PLAIN_HEAD_MODELS,
            cache_dtype=cache_dtype,
        )
        if body.name in self.bases:
            raise Conflict(f"name: base {body.name!r} already exists")
        self.bases[body.name] = base
        return base.info()

    @on_compute_thread
    def list_bases(self) -> BaseList:
        return BaseList(bases=[b.info() for b in self.bases.values()])

    def get_base(self, name: str | None, field_name: str = "base") -> Base:
        if name is None:
            raise BadRequest(f"{field_name}: required")
        base = self.bases.get(name)
        if base is None:
            raise NotFound(f"{field_name}: unknown base {name!r} (loaded: {sorted(self.bases)})")
        return base

    def get_adapter(self, name: str, field_name: str = "adapter") -> Adapter:
        adapter = self.adapters.get(name)
        if adapter is None:
            raise NotFound(f"{field_name}: unknown adapter {name!r} (known: {sorted(self.adapters)})")
        return adapter

    def resolve(self, adapter: str, base: str | None, field_prefix: str = "") -> tuple[Base, Adapter | None]:
        """(base, adapter) for an adapter name, or (base, None) for __base__."""
        if adapter == BASE_ADAPTER:
            return self.get_base(base, f"{field_prefix}base"), None
        a = self.get_adapter(adapter, f"{field_prefix}adapter")
        if base is not None and base != a.base.name:
            raise BadRequest(
                f"{field_prefix}base: adapter {adapter!r} is on base {a.base.name!r}, not {base!r}"
            )
        return a.base, a

    @on_compute_thread
    def create_adapter(self, body: AdapterCreate) -> AdapterInfo:
        if not NAME_RE.match(body.name) or body.name == BASE_ADAPTER:
            raise BadRequest(f"name: {body.name!r} must match [A-Za-z0-9_-]+ and not be {BASE_ADAPTER}")
        if body.kind == "policy" and body.value_head_hidden:
            raise BadRequest("value_head_hidden: only critic adapters have a value head")
        if body.name in self.adapters:
            raise Conflict(f"name: adapter {body.name!r} already exists")
        base = self.get_base(body.base)
        lora = body.lora
        init_state: dict[str, torch.Tensor] | None = None
        if body.init_from is not None:
            lora, init_state = read_peft_dir(body.init_from)
        n_layers = int(getattr(base.hf.config, "num_hidden_layers", 0))
        if lora.layers is not None:
            bad = [x for x in lora.layers if not -n_layers <= x < n_layers]
            if bad or not lora.layers:
                raise BadRequest(
                    f"lora.layers: expected layer indices in [-{n_layers}, {n_layers}) of base "
                    f"{base.name!r}, got {lora.layers}"
                )
            lora = lora.model_copy(update={"layers": sorted({x % n_layers for x in lora.layers})})
        cfg = peft.LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            layers_to_transform=lora.layers,
            bias="none",
            task_type="CAUSAL_LM",
        )
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(body.seed)
                if base.peft is None:
                    base.peft = peft.get_peft_model(base.hf, cfg, adapter_name=body.name)
                else:
                    base.peft.add_adapter(body.name, cfg)
        except ValueError as e:
            raise BadRequest(f"lora.target_modules: {e}") from e
        base.peft.eval()
        if init_state is not None:
            result = peft.set_peft_model_state_dict(base.peft, init_state, adapter_name=body.name)
            missing = [k for k in result.missing_keys if f".{body.name}." in k and "lora_" in k]
            if missing:
                self._drop_peft_adapter(base, body.name)
                raise BadRequest(f"init_from: {body.init_from!r} lacks weights such as {missing[0]}")
        params = adapter_params(base.peft, body.name)
        head = None
        if body.kind == "critic":
            head = make_value_head(base.hf.config.hidden_size, body.value_head_hidden, body.seed + 1)
            head = head.to(self.device)
            params = params + list(head.parameters())
        for p in params:
            p.data = p.data.float()  # fp32 master weights whatever the base dtype
        optimizer = make_optimizer(params, body.optimizer)
        adapter = Adapter(
            name=body.name,
            base=base,
            kind=body.kind,
            lora=lora,
            opt=body.optimizer,
            value_head_hidden=list(body.value_head_hidden),
            params=params,
            optimizer=optimizer,
            value_head=head,
            lr=body.optimizer.lr,
            seed=body.seed,
        )
        self.adapters[body.name] = adapter
        lora_batch.bump()
        return adapter.info()

    def _drop_peft_adapter(self, base: Base, name: str) -> None:
        assert base.peft is not None
        if list(base.peft.peft_config) == [name]:
            # PEFT does not work with zero adapters: take the LoRA layers out and drop the wrapper
            base.hf = base.peft.unload()
            base.peft = None
        else:
            base.peft.delete_adapter(name)

    @on_compute_thread
    def list_adapters(self) -> AdapterList:
        return AdapterList(adapters=[a.info() for a in self.adapters.values()])

    @on_compute_thread
    def delete_adapter(self, name: str) -> AdapterInfo:
        adapter = self.get_adapter(name, "name")
        info = adapter.info()
        self._drop_peft_adapter(adapter.base, name)
        del self.adapters[name]
        lora_batch.bump()
        return info

    # ------------------------------------------------------------------------------------------------
    # sampling (the decode loop is in sampler.py)

    def sample(self, body: SampleBatch) -> SampleResponse:
        return self.submit_sample(body).result()

    @on_compute_thread
    def submit_sample(self, body: SampleBatch) -> concurrent.futures.Future[SampleResponse]:
        return self.sampler.submit(body)

    # ------------------------------------------------------------------------------------------------
    # forward and training

    @contextlib.contextmanager
    def _active(self, base: Base, adapter: Adapter | None, train: bool = False) -> Iterator[None]:
        """Run the base's model with exactly `adapter` active (None: all adapters disabled)."""
        if base.peft is None:  # no adapter was ever made on it
            assert adapter is None
            yield
            return
        if adapter is None:
            with base.peft.disable_adapter():
                yield
            return
        # set_adapter also makes only this adapter's LoRA weights require grad
        base.peft.set_adapter(adapter.name)
        base.peft.train(train and adapter.lora.dropout > 0)
        try:
            yield
        finally:
            base.peft.eval()

    def _validate_data(self, base: Base, data: list[Datum], need: list[str]) -> None:
        for i, d in enumerate(data):
            n = len(d.tokens)
            if n > base.context_length:
                raise BadRequest(
                    f"data[{i}].tokens: length {n} exceeds the context length {base.context_length} of base {base.name!r}"
                )
            for j, t in enumerate(d.tokens):
                if not 0 <= t < base.vocab_size:
                    raise BadRequest(
                        f"data[{i}].tokens[{j}]: token id {t} is outside the vocabulary [0, {base.vocab_size})"
                    )
            for key in ("weights", "old_logprobs", "advantages", "returns", "old_values"):
                arr = getattr(d, key)
                if arr is not None and len(arr) != n:
                    raise BadRequest(f"data[{i}].{key}: length {len(arr)} != len(tokens) {n}")
            for key in need:
                if getattr(d, key) is None:
                    raise BadRequest(f"data[{i}].{key}: required by this loss")
            if d.weights is not None and d.weights[0] != 0:
                raise BadRequest(f"data[{i}].weights[0]: must be 0 (token 0 has no prediction)")

    def _micro_batches(
        self, data: list[Datum], budget: int, base: Base, critic: bool = False
    ) -> list[list[int]]:
        """Consecutive groups whose padded size (rows x longest) stays within the token budget, and
        whose fp32 logits stay near LOGITS_BUDGET elements: with a 49k vocabulary, 8192 tokens of
        logits and the log-softmax, exp and gradient tensors built from them take over 10 GB, which a
        24 GB machine cannot spare. Logits exist only at the scored positions (weights > 0) for model
        families with a plain LM head (see _token_scores), at every position otherwise; a critic
        has none."""
        groups: list[list[int]] = []
        cur: list[int] = []
        longest = 0
        scored = 0  # positions of the current group that need logits (plain head)
        for i, d in enumerate(data):
            n = len(d.tokens)
            padded = (len(cur) + 1) * max(longest, n)
            mine = sum(1 for w in d.weights[1:] if w > 0) if d.weights is not None else n - 1
            logit_rows = 0 if critic else (scored + mine if base.plain_head else padded)
            if cur and (padded > budget or logit_rows * base.vocab_size > LOGITS_BUDGET):
                groups.append(cur)
                cur, longest, scored = [], 0, 0
            cur.append(i)
            longest = max(longest, n)
            scored += mine
        if cur:
            groups.append(cur)
        return groups

    def _pad(
        self, base: Base, data: list[Datum], idx: list[int], key: str, default: float = 0.0
    ) -> torch.Tensor:
        """[B, T] right-padded float tensor of a per-token field (weights default: all but token 0)."""
        T = max(len(data[i].tokens) for i in idx)
        out = torch.full((len(idx), T), default, dtype=torch.float32)
        for r, i in enumerate(idx):
            d = data[i]
            arr = getattr(d, key) if key != "tokens" else d.tokens
            if arr is None and key == "weights":
                arr = [0.0] + [1.0] * (len(d.tokens) - 1)
            if arr is not None:
                out[r, : len(arr)] = torch.tensor(arr, dtype=torch.float32)
        return out.to(base.device)

    def _inputs(self, base: Base, data: list[Datum], idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        T = max(len(data[i].tokens) for i in idx)
        ids = torch.full((len(idx), T), base.pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), T), dtype=torch.long)
        for r, i in enumerate(idx):
            n = len(data[i].tokens)
            ids[r, :n] = torch.tensor(data[i].tokens, dtype=torch.long)
            mask[r, :n] = 1
        return ids.to(base.device), mask.to(base.device)

    def _logits(self, base: Base, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with base.autocast():
            return base.hf(input_ids=ids, attention_mask=mask, use_cache=False).logits  # [B, T, V]

    def _token_scores(
        self, base: Base, ids: torch.Tensor, mask: torch.Tensor, w: torch.Tensor, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy) [B, T] as losses.logprobs_and_entropies, but only where the weight w [B, T]
        is positive; zero elsewhere. Why: the LM head and its softmax are a vocabulary-wide (49k for
        SmolLM2) matmul and fp32 pass per position, and a policy's loss needs only the action tokens,
        not the prompt's, which are most of a sequence. Other model families (logit scaling or
        soft-capping in their forward) take the full-logits path."""
        if not base.plain_head:
            return losses.logprobs_and_entropies(self._logits(base, ids, mask), ids, temperature)
        sel = w > 0  # [B, T]
        sel[:, 0] = False  # position 0 predicts nothing
        with base.autocast():
            hidden = base.hf.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            logits = base.hf.lm_head(hidden[:, :-1][sel[:, 1:]])  # [N, V]: the state before each token
        logp, ent = losses.selected_logprobs_and_entropies(logits, ids[sel], temperature)  # [N], [N]
        return losses.scatter_selected(logp, sel), losses.scatter_selected(ent, sel)

    def _values(self, base: Base, adapter: Adapter, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """values[b, t] = V(tokens[b, : t + 1]) from the last (final-norm) hidden state."""
        assert adapter.value_head is not None
        with base.autocast():
            hidden = base.hf.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        return adapter.value_head(hidden.float()).squeeze(-1)  # [B, T]

    @on_compute_thread
    def forward(self, body: ForwardRequest) -> ForwardResponse:
        base, adapter = self.resolve(body.adapter, body.base)
        self._validate_data(base, body.data, [])
        results: list[ForwardResult] = [ForwardResult() for _ in body.data]
        with torch.no_grad(), self._active(base, adapter):
            critic = adapter is not None and adapter.kind == "critic"
            for idx in self._micro_batches(body.data, body.micro_batch_tokens, base, critic):
                ids, mask = self._inputs(base, body.data, idx)
                if critic:
                    values = self._values(base, adapter, ids, mask)
                    for r, i in enumerate(idx):
                        n = len(body.data[i].tokens)
                        results[i] = ForwardResult(values=values[r, :n].tolist())
                    continue
                # weights given: log-probs only where they are positive (e.g. a response), 0 elsewhere
                w = self._pad(base, body.data, idx, "weights")  # [B, T]
                logp, ent = self._token_scores(base, ids, mask, w, body.temperature)
                for r, i in enumerate(idx):
                    n = len(body.data[i].tokens)
                    results[i] = ForwardResult(logprobs=logp[r, :n].tolist(), entropies=ent[r, :n].tolist())
        return ForwardResponse(results=results)

    @on_compute_thread
    def forward_backward(self, body: ForwardBackwardRequest) -> ForwardBackwardResponse:
        adapter = self.get_adapter(body.adapter)
        base = adapter.base
        if body.loss == "value" and adapter.kind != "critic":
            raise BadRequest(f"loss: 'value' needs a critic adapter; {adapter.name!r} is a policy")
        if body.loss != "value" and adapter.kind != "policy":
            raise BadRequest(f"loss: {body.loss!r} needs a policy adapter; {adapter.name!r} is a critic")
        need = {
            "ppo": ["old_logprobs", "advantages"],
            "importance_sampling": ["old_logprobs", "advantages"],
            "cross_entropy": [],
            "value": ["returns"] + (["old_values"] if body.value.clip is not None else []),
        }[body.loss]
        data = body.data
        self._validate_data(base, data, need)

        # Normalisers over the whole call, so micro-batch gradients sum to the full-batch gradient.
        all_w = [(d.weights if d.weights is not None else [0.0] + [1.0] * (len(d.tokens) - 1)) for d in data]
        total_w = float(sum(sum(w) for w in all_w))
        if total_w <= 0:
            raise BadRequest("data[*].weights: no token has a positive weight")
        agg = body.ppo.aggregation
        norm = total_w if agg == "token-mean" else float(len(data))
        st = _CallStats()
        total_loss = 0.0
        groups = self._micro_batches(data, body.micro_batch_tokens, base, body.loss == "value")
        cfg = body.ppo
        want_ref = body.loss == "ppo" and cfg.kl_coef > 0
        for idx in groups:
            ids, mask = self._inputs(base, data, idx)
            w = self._pad(base, data, idx, "weights")  # [B, T]
            ref_logp = None
            if want_ref:
                with torch.no_grad(), self._active(base, None):
                    ref_logp, _ = self._token_scores(base, ids, mask, w, body.temperature)
            with self._active(base, adapter, train=True):
                if body.loss == "value":
                    values = self._values(base, adapter, ids, mask)  # [B, T]
                    returns = self._pad(base, data, idx, "returns")
                    old_v = self._pad(base, data, idx, "old_values") if body.value.clip is not None else None
                    loss, clipped = losses.value_loss(
                        values,
                        returns,
                        old_v,
                        w,
                        kind=body.value.loss,
                        huber_delta=body.value.huber_delta,
                        clip=body.value.clip,
                        aggregation=agg,
                        norm=norm,
                    )
                    v = values.detach()
                    st.add("value_mean", (v * w).sum())
                    st.add("return_mean", (returns * w).sum())
                    st.add("return_sq", (returns**2 * w).sum())
                    st.add("residual", ((returns - v) * w).sum())
                    st.add("residual_sq", ((returns - v) ** 2 * w).sum())
                    st.add("clipfrac", (clipped.float() * w).sum())
                else:
                    need_ent_grad = body.loss == "ppo" and cfg.entropy_coef != 0
                    logp, ent = self._token_scores(base, ids, mask, w, body.temperature)
                    if not need_ent_grad:
                        ent = ent.detach()
                    st.add("entropy", (ent.detach() * w).sum())
                    if body.loss == "cross_entropy":
                        loss = losses.cross_entropy_loss(logp, w, aggregation=agg, norm=norm)
                    else:
                        old = self._pad(base, data, idx, "old_logprobs")
                        adv = self._pad(base, data, idx, "advantages")
                        if body.loss == "ppo":
                            terms = losses.ppo_loss(
                                logp,
                                old,
                                adv,
                                w,
                                ent if need_ent_grad else None,
                                ref_logp,
                                clip_low=cfg.clip_low,
                                clip_high=cfg.clip_high,
                                entropy_coef=cfg.entropy_coef,
                                kl_coef=cfg.kl_coef,
                                kl_estimator=cfg.kl_estimator,
                                ratio_level=cfg.ratio,
                                sequence_logprob=cfg.sequence_logprob,
                                aggregation=agg,
                                norm=norm,
                            )
                            loss = terms.loss
                            st.add("clipfrac", (terms.clipped.float() * w).sum())
                            if terms.kl_ref is not None:
                                st.add("kl_ref", (terms.kl_ref.detach() * w).sum())
                        else:
                            loss, _ = losses.importance_sampling_loss(
                                logp, old, adv, w, aggregation=agg, norm=norm
                            )
                        log_r = (logp.detach() - old) * (w > 0)  # token-level, for the stats
                        r = log_r.exp()
                        st.add("ratio_mean", (r * w).sum())
                        st.add("approx_kl", (((r - 1) - log_r) * w).sum())
                (loss * body.loss_scale).backward()
            total_loss += float(loss.detach())
        tokens = int(sum(len(d.tokens) for d in data))
        self.counters.tokens_trained += tokens
        stats = {k: v / total_w for k, v in st.sums.items()}
        if body.loss == "value":
            mean_r = stats["return_mean"]
            var_r = stats.pop("return_sq") - mean_r**2
            mean_res = stats.pop("residual")
            var_res = stats.pop("residual_sq") - mean_res**2
            stats["return_var"] = var_r
            stats["residual_var"] = var_res
            stats["explained_variance"] = 1.0 - var_res / var_r if var_r > 1e-12 else 0.0
        stats["tokens"] = float(sum(sum(1 for x in w if x > 0) for w in all_w))
        stats["weight_sum"] = total_w
        stats["micro_batches"] = float(len(groups))
        return ForwardBackwardResponse(loss=total_loss, stats=stats, num_data=len(data), num_tokens=tokens)

    @on_compute_thread
    def optim_step(self, body: OptimStepRequest) -> OptimStepResponse:
        adapter = self.get_adapter(body.adapter)
        if body.lr is not None:
            adapter.lr = body.lr
            for group in adapter.optimizer.param_groups:
                group["lr"] = body.lr
        grads = [p for p in adapter.params if p.grad is not None]
        if grads:
            max_norm = body.max_grad_norm if body.max_grad_norm is not None else float("inf")
            norm = float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
        else:
            norm = 0.0
        adapter.optimizer.step()
        adapter.optimizer.zero_grad(set_to_none=True)
        adapter.version += 1
        lora_batch.bump()
        return OptimStepResponse(adapter=adapter.name, version=adapter.version, grad_norm=norm, lr=adapter.lr)

    # ------------------------------------------------------------------------------------------------
    # checkpoints

    @on_compute_thread
    def save_checkpoint(self, body: CheckpointRequest) -> CheckpointResponse:
        names = body.adapters if body.adapters is not None else list(self.adapters)
        for i, n in enumerate(names):
            self.get_adapter(n, f"adapters[{i}]")
        target = Path(body.path)
        parent = target.parent
        if not parent.is_dir():
            raise BadRequest(f"path: parent directory {str(parent)!r} does not exist")
        tmp = parent / f"{target.name}.tmp-{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            manifest: dict[str, Any] = {"format": 1, "adapters": {}, "bases": {}}
            for n in names:
                a = self.adapters[n]
                d = tmp / "adapters" / n
                write_peft_dir(a, d)
                if a.value_head is not None:
                    save_file(
                        {k: v.detach().cpu().contiguous() for k, v in a.value_head.state_dict().items()},
                        d / "value_head.safetensors",
                    )
                torch.save(a.optimizer.state_dict(), d / "optimizer.pt")
                manifest["adapters"][n] = {
                    "base": a.base.name,
                    "kind": a.kind,
                    "version": a.version,
                    "lr": a.lr,
                    "lora": a.lora.model_dump(),
                    "optimizer": a.opt.model_dump(),
                    "value_head_hidden": a.value_head_hidden,
                    "seed": a.seed,
                }
                b = a.base
                manifest["bases"][b.name] = {"source": b.source, "seed": b.seed}
            rng = {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
            }
            if torch.cuda.is_available():
                rng["cuda"] = torch.cuda.get_rng_state_all()
            torch.save(rng, tmp / "rng.pt")
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
            if target.exists():
                # os.replace cannot swap a directory onto a non-empty one: move the old one aside first.
                old = parent / f"{target.name}.old-{secrets.token_hex(4)}"
                os.replace(target, old)
                os.replace(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CheckpointResponse(path=str(target), adapters=names)

    @on_compute_thread
    def load_checkpoint(self, body: CheckpointRequest) -> CheckpointResponse:
        root = Path(body.path)
        mf = root / "manifest.json"
        if not mf.is_file():
            raise BadRequest(f"path: {body.path!r} is not a checkpoint (no manifest.json)")
        manifest = json.loads(mf.read_text())
        names = body.adapters if body.adapters is not None else list(manifest["adapters"])
        for i, n in enumerate(names):
            if n not in manifest["adapters"]:
                raise BadRequest(f"adapters[{i}]: {n!r} is not in the checkpoint")
            b = manifest["adapters"][n]["base"]
            if b not in self.bases:
                raise BadRequest(
                    f"adapters[{i}]: its base {b!r} ({manifest['bases'][b]['source']}) is not loaded; create it first"
                )
        for n in names:
            m = manifest["adapters"][n]
            d = root / "adapters" / n
            a = self.adapters.get(n)
            if a is not None and (a.kind != m["kind"] or a.base.name != m["base"]):
                raise BadRequest(
                    f"adapters: {n!r} exists here as a {a.kind} on {a.base.name}; the checkpoint has a {m['kind']} on {m['base']}"
                )
            if a is None:
                self.create_adapter(
                    AdapterCreate(
                        name=n,
                        base=m["base"],
                        kind=m["kind"],
                        lora=LoraConfig(**m["lora"]),
                        optimizer=OptimizerConfig(**m["optimizer"]),
                        value_head_hidden=m["value_head_hidden"],
                        seed=m["seed"],
                    )
                )
                a = self.adapters[n]
            _, state = read_peft_dir(str(d))
            assert a.base.peft is not None
            peft.set_peft_model_state_dict(a.base.peft, state, adapter_name=n)
            if a.value_head is not None:
                a.value_head.load_state_dict(load_file(d / "value_head.safetensors", device=str(self.device)))
            for p in a.params:
                p.grad = None
            a.optimizer.load_state_dict(
                torch.load(d / "optimizer.pt", map_location=self.device, weights_only=False)
            )
            a.version = int(m["version"])
            a.lr = float(m["lr"])
        lora_batch.bump()
        rng = torch.load(root / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        return CheckpointResponse(path=str(root), adapters=names)

    # ------------------------------------------------------------------------------------------------

    @on_compute_thread
    def stats(self, endpoints: dict[str, tuple[int, float]]) -> Stats:
        rss = _rss_bytes()
        cuda = self.device.type == "cuda"
        return Stats(
            device=self.device_name,
            rss_bytes=rss,
            cuda_allocated_bytes=torch.cuda.memory_allocated() if cuda else None,
            cuda_max_allocated_bytes=torch.cuda.max_memory_allocated() if cuda else None,
            tokens_sampled=self.counters.tokens_sampled,
            tokens_trained=self.counters.tokens_trained,
            decode_steps=self.counters.decode_steps,
            decode_rows=self.counters.decode_rows,
            endpoints={k: EndpointStats(calls=c, seconds=s) for k, (c, s) in sorted(endpoints.items())},
        )


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def adapter_params(model: peft.PeftModel, name: str) -> list[torch.nn.Parameter]:
    """This adapter's LoRA parameters, in module order (the optimizer state is saved in this order)."""
    out = []
    for n, p in model.named_parameters():
        parts = n.split(".")
        if name in parts and any(x.startswith("lora_") for x in parts):
            out.append(p)
    return out


def make_optimizer(params: list[torch.nn.Parameter], cfg: OptimizerConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=False
    )


def write_peft_dir(adapter: Adapter, d: Path) -> None:
    """The standard PEFT folder: adapter_config.json + adapter_model.safetensors (keys without the
    adapter name, as PeftModel.from_pretrained expects)."""
    model = adapter.base.peft
    assert model is not None
    d.mkdir(parents=True, exist_ok=True)
    state = peft.get_peft_model_state_dict(model, adapter_name=adapter.name)
    save_file(
        {k: v.detach().float().contiguous().cpu() for k, v in state.items()}, d / "adapter_model.safetensors"
    )
    config = model.peft_config[adapter.name]
    config.base_model_name_or_path = adapter.base.source
    config.save_pretrained(str(d))


def read_peft_dir(path: str) -> tuple[LoraConfig, dict[str, torch.Tensor]]:
    d = Path(path)
    cfg_file = d / "adapter_config.json"
    weights = d / "adapter_model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise BadRequest(
            f"init_from: {path!r} is not a PEFT folder (adapter_config.json + adapter_model.safetensors)"
        )
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise BadRequest(f"init_from: {path!r} holds a {cfg.get('peft_type')} adapter, not LoRA")
    targets = cfg.get("target_modules") or ["q_proj", "v_proj"]
    if isinstance(targets, str):
        raise BadRequest(f"init_from: {path!r} uses a regex target_modules, which is not supported")
    lora = LoraConfig(
        r=int(cfg.get("r", 8)),
        alpha=float(cfg.get("lora_alpha", 16)),
        dropout=float(cfg.get("lora_dropout", 0.0)),
        target_modules=sorted(targets),
        layers=[layers] if isinstance(layers := cfg.get("layers_to_transform"), int) else layers,
    )
    return lora, load_file(str(weights))
