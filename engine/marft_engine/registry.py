"""The bases and adapters the engine holds.

A base is one frozen model; PEFT injects every adapter's LoRA layers into it in place, so all of a
base's adapters share its weights (`Base.peft` holds them all). An adapter is a policy or a critic
(with a value head); its LoRA weights, value head and AdamW state are its own, in fp32 whatever the
base's dtype.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Literal

import peft
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from . import chat, lora_batch, precision
from .errors import BadRequest, Conflict, NotFound
from .models import context_length, load_source, plain_head
from .peft_folder import read_peft_dir
from .schemas import (
    AdapterCreate,
    AdapterInfo,
    BaseCreate,
    BaseInfo,
    LoraConfig,
    OptimizerConfig,
    SampleRequest,
)

log = logging.getLogger("marft_engine")

BASE_ADAPTER = "__base__"  # the adapter name that means the bare base (every adapter disabled)
NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def at_positions(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """x [B, T, ...] at the last position [B, ...], or at the flattened positions index [M, ...]."""
    return x[:, -1] if index is None else x.flatten(0, 1)[index]


@dataclass
class Base:
    name: str
    source: str
    hf: PreTrainedModel  # the HF model; PEFT injects its LoRA layers into it in place
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    # compute dtype (bf16: autocast; on CPU embeddings and norms stay fp32, see precision.py)
    dtype: torch.dtype
    dtype_reason: str  # why this dtype (precision.compute_dtype): requested, or what auto saw
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
    # memory budget of the sampler's shared-prefix KV cache for this base (prefix_cache.py); 0 = off
    prefix_cache_bytes: int = 0
    peft: peft.PeftModel | None = None  # created with the first adapter, then holds all of them

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The context every pass of this base runs in (see precision.py)."""
        return precision.autocast(self.device, self.dtype)

    def last_logits(self, kw: dict[str, object], index: torch.Tensor | None = None) -> torch.Tensor:
        """[B, V] the last position's logits of a pass of the model with arguments kw; with index [M],
        the logits [M, V] at those of the flattened [B * T] positions. Where the head is plain, the
        trunk and then the head on those positions, as one 2-D matmul. Why: through the model's own
        forward (`logits_to_keep=1`) the head gets a strided [B, 1, d] slice, which matmul turns into
        one product per row with the head's weights broadcast: 8x slower on a CPU for a prefill of 32
        prompts (docs/MEASUREMENTS.md)."""
        if not self.plain_head:
            return at_positions(self.hf(**kw, logits_to_keep=1 if index is None else 0).logits, index).float()
        hidden = self.hf.model(**kw).last_hidden_state  # [B, T, d]
        return self.hf.lm_head(at_positions(hidden, index)).float()

    def request_prompt(self, i: int, req: SampleRequest) -> tuple[list[int], list[int]]:
        """Request i's prompt ids on this base, and the messages whose token_ids went in as text (chat.py)."""
        if (req.messages is None) == (req.prompt_ids is None):
            raise BadRequest(f"requests[{i}]: give exactly one of messages and prompt_ids")
        retokenized: list[int] = []
        if req.tools is not None and req.messages is None:
            raise BadRequest(f"requests[{i}].tools: tools go with messages, not prompt_ids")
        if req.messages is not None:
            prompt = chat.prompt_ids(
                self.tokenizer,
                req.messages,
                req.tools,
                self.eos_ids,
                self.vocab_size,
                where=f"requests[{i}].",
                base_name=self.name,
            )
            ids, retokenized = prompt.ids, prompt.retokenized
            field_name = "messages"
        else:
            assert req.prompt_ids is not None
            ids = list(req.prompt_ids)
            field_name = "prompt_ids"
            if not ids:
                raise BadRequest(f"requests[{i}].prompt_ids: empty")
            for j, t in enumerate(ids):
                if not 0 <= t < self.vocab_size:
                    raise BadRequest(
                        f"requests[{i}].prompt_ids[{j}]: token id {t} is outside the vocabulary [0, {self.vocab_size})"
                    )
        if len(ids) >= self.context_length:
            raise BadRequest(
                f"requests[{i}].{field_name}: the prompt is {len(ids)} tokens; the context of base "
                f"{self.name!r} is {self.context_length}"
            )
        return ids, retokenized

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
            dtype_reason=self.dtype_reason,
            tools=chat.supports_tools(self.tokenizer),
        )


@dataclass
class Adapter:
    name: str
    base: Base
    kind: Literal["policy", "critic"]
    lora: LoraConfig
    opt: OptimizerConfig
    value_head_hidden: list[int]
    params: list[torch.nn.Parameter]  # LoRA (+ value head) parameters, in a fixed order
    optimizer: torch.optim.AdamW
    lr: float
    seed: int
    value_head: torch.nn.Module | None = None
    version: int = 0

    def info(self) -> AdapterInfo:
        return AdapterInfo(
            name=self.name,
            base=self.base.name,
            kind=self.kind,
            version=self.version,
            num_trainable_parameters=sum(p.numel() for p in self.params),
            lora=self.lora,
        )


class Registry:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bases: dict[str, Base] = {}
        self.adapters: dict[str, Adapter] = {}

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

    def create_base(self, body: BaseCreate) -> Base:
        if not NAME_RE.match(body.name) or body.name == BASE_ADAPTER:
            raise BadRequest(f"name: {body.name!r} must match [A-Za-z0-9_-]+ and not be {BASE_ADAPTER}")
        if body.name in self.bases:
            raise Conflict(f"name: base {body.name!r} already exists")
        try:
            model, tokenizer = load_source(body.source, body.seed)
        except (OSError, ValueError) as e:  # unreadable or foreign files: the caller's source is wrong
            raise BadRequest(f"source: cannot load {body.source!r}: {e}") from e
        dtype, dtype_reason = precision.compute_dtype(body.dtype, self.device)
        log.info("base %s (%s): computes in %s (%s)", body.name, body.source, dtype, dtype_reason)
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
            dtype_reason=dtype_reason,
            context_length=context_length(model.config),
            eos_ids=eos_ids,
            pad_id=int(pad),
            vocab_size=int(model.config.vocab_size),
            num_parameters=sum(p.numel() for p in model.parameters()),
            seed=body.seed,
            plain_head=plain_head(model.config),
            cache_dtype=cache_dtype,
            prefix_cache_bytes=int(body.prefix_cache_mb * 2**20),
        )
        self.bases[body.name] = base
        return base

    def create_adapter(self, body: AdapterCreate) -> Adapter:
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
        adapter = Adapter(
            name=body.name,
            base=base,
            kind=body.kind,
            lora=lora,
            opt=body.optimizer,
            value_head_hidden=list(body.value_head_hidden),
            params=params,
            optimizer=make_optimizer(params, body.optimizer),
            lr=body.optimizer.lr,
            seed=body.seed,
            value_head=head,
        )
        self.adapters[body.name] = adapter
        lora_batch.bump()
        return adapter

    def delete_adapter(self, name: str) -> AdapterInfo:
        adapter = self.get_adapter(name, "name")
        info = adapter.info()
        self._drop_peft_adapter(adapter.base, name)
        del self.adapters[name]
        lora_batch.bump()
        return info

    def _drop_peft_adapter(self, base: Base, name: str) -> None:
        assert base.peft is not None
        if list(base.peft.peft_config) == [name]:
            # PEFT does not work with zero adapters: take the LoRA layers out and drop the wrapper
            base.hf = base.peft.unload()
            base.peft = None
        else:
            base.peft.delete_adapter(name)


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


def adapter_params(model: peft.PeftModel, name: str) -> list[torch.nn.Parameter]:
    """This adapter's LoRA parameters, in module order (the optimizer state is saved in this order)."""
    out = []
    for n, p in model.named_parameters():
        parts = n.split(".")
        if name in parts and any(x.startswith("lora_") for x in parts):
            out.append(p)
    return out


def make_optimizer(params: list[torch.nn.Parameter], cfg: OptimizerConfig) -> torch.optim.AdamW:
    # foreach on a GPU: a few kernels a step over all of an adapter's hundreds of LoRA tensors, not
    # several per tensor (a step is bound by launches). A CPU keeps the per-tensor loop (the golden
    # runs' bits; PyTorch's own default there).
    foreach = bool(params) and params[0].device.type == "cuda"
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=foreach
    )
