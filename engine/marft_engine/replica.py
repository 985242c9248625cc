"""One engine replica, run as a Ray actor by replicas.py: an `Engine`, the gradient all-reduce before
its optimizer step, and its whole state exported to, or imported from, another replica.

An async actor: Ray runs its methods on one event loop and each waits for the Engine off that loop
(as server.py does), so concurrent sample calls join the replica's decode batch as they join one
engine's. Every call that changes the state the replicas must share (bases, adapters, weights,
optimizer states, versions) carries the front's sequence number, and the replica remembers the last
one it applied with its answer: after a replica dies, that says which survivor is the most recent.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import random
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from . import lora_batch, training
from .engine import Engine
from .schemas import (
    AdapterCreate,
    AdapterInfo,
    AdapterList,
    BaseCreate,
    BaseInfo,
    BaseList,
    CheckpointRequest,
    CheckpointResponse,
    ForwardBackwardRequest,
    ForwardBackwardResponse,
    ForwardRequest,
    ForwardResponse,
    OptimStepRequest,
    OptimStepResponse,
    Progress,
    RetokenizeRequest,
    RetokenizeResponse,
    SampleBatch,
    SampleResponse,
    Stats,
)
from .shards import CallTotals

T = TypeVar("T")
# How long a collective (the all-reduce, joining the process group) waits for every replica. A
# replica that dies is noticed at once (its connections close); this bounds a replica that hangs.
GROUP_TIMEOUT = datetime.timedelta(minutes=10)


def allreduce_grads(params: list[torch.nn.Parameter]) -> None:
    """Sum the parameters' gradients over the replicas, in one collective. Each replica holds its
    shards' share of the call's loss, so the sum is the whole batch's gradient. A parameter without a
    gradient here takes part with zeros, and stays without one only if no replica has one (AdamW
    then skips it, as one engine would)."""
    if not params:
        return
    has = [p.grad is not None for p in params]
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    flags = torch.tensor(has, dtype=parts[0].dtype, device=parts[0].device)
    flat = torch.cat([*parts, flags])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
    for p, flag in zip(params, flat[offset:].tolist(), strict=True):
        if flag == 0:
            p.grad = None


def _to_cpu(x: Any) -> Any:
    """A copy of nested dicts / lists / tuples with every tensor on the CPU (to send it to another
    process, whatever device it lives on here)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    return x


class Replica:
    def __init__(
        self, index: int, device: str, max_batch: int, threads: int | None, checkpoint_root: str | None = None
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.index = index
        self.engine = Engine(device=device, max_batch=max_batch, checkpoint_root=checkpoint_root)
        self.bases: list[BaseCreate] = []  # the bases made here, in order: a replacement makes them too
        self.applied: tuple[int, Any] = (0, None)  # (sequence number, answer) of the last change
        self.world = 1

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def _on_compute(self, fn: Callable[[], T]) -> T:
        return self.engine.compute.call(fn)

    async def _change(self, seq: int, fn: Callable[..., T], *args: Any) -> T:
        answer = await self._run(fn, *args)
        self.applied = (seq, answer)
        return answer

    # ---------------------------------------------------------------------------------------------
    # about the replica

    async def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "node": _node_ip(),
            "device": self.engine.device_name,
            "threads": torch.get_num_threads(),
        }

    async def ping(self) -> int:
        return self.index

    async def last_applied(self) -> tuple[int, Any]:
        return self.applied

    async def progress(self) -> Progress:
        return self.engine.progress()  # off the compute thread: answers while a long call runs

    async def stats(self) -> Stats:
        return await self._run(self.engine.stats, {})

    # ---------------------------------------------------------------------------------------------
    # the Engine's calls

    async def create_base(self, seq: int, body: BaseCreate) -> BaseInfo:
        info = await self._change(seq, self.engine.create_base, body)
        self.bases.append(body)
        return info

    async def list_bases(self) -> BaseList:
        return await self._run(self.engine.list_bases)

    async def create_adapter(self, seq: int, body: AdapterCreate) -> AdapterInfo:
        return await self._change(seq, self.engine.create_adapter, body)

    async def list_adapters(self) -> AdapterList:
        return await self._run(self.engine.list_adapters)

    async def delete_adapter(self, seq: int, name: str) -> AdapterInfo:
        return await self._change(seq, self.engine.delete_adapter, name)

    async def sample(self, body: SampleBatch) -> SampleResponse:
        future = await self._run(self.engine.submit_sample, body)
        return await asyncio.wrap_future(future)

    async def draw_seed(self) -> int:
        """A batch seed from this replica's RNG, which is saved in checkpoints (as one engine draws it
        for a batch without a seed)."""
        return await self._run(self._on_compute, lambda: int(torch.randint(0, 2**62, (1,)).item()))

    async def retokenize(self, body: RetokenizeRequest) -> RetokenizeResponse:
        return await self._run(self.engine.retokenize, body)

    async def forward(self, body: ForwardRequest) -> ForwardResponse:
        return await self._run(self.engine.forward, body)

    async def forward_backward(
        self, body: ForwardBackwardRequest, call: CallTotals
    ) -> ForwardBackwardResponse:
        return await self._run(self.engine.forward_backward, body, call)

    async def optim_step(self, seq: int, body: OptimStepRequest) -> OptimStepResponse:
        def step() -> OptimStepResponse:
            adapter = self.engine.registry.get_adapter(body.adapter)  # every replica refuses alike
            if self.world > 1:
                allreduce_grads(adapter.params)
            return training.optim_step(self.engine.registry, body)

        return await self._change(seq, self._on_compute, step)

    async def zero_grads(self) -> None:
        """Drop every adapter's accumulated gradients (before the front replays the calls since the
        last optimizer steps)."""

        def drop() -> None:
            for a in self.engine.adapters.values():
                for p in a.params:
                    p.grad = None

        await self._run(self._on_compute, drop)

    async def grads(self, adapter: str) -> list[torch.Tensor | None]:
        """The adapter's accumulated gradients, on the CPU (what this replica adds to the all-reduce)."""

        def read() -> list[torch.Tensor | None]:
            return [None if p.grad is None else _to_cpu(p.grad) for p in self.engine.adapters[adapter].params]

        return await self._run(self._on_compute, read)

    async def save_checkpoint(self, body: CheckpointRequest) -> CheckpointResponse:
        return await self._run(self.engine.save_checkpoint, body)

    async def load_checkpoint(self, seq: int, body: CheckpointRequest) -> CheckpointResponse:
        return await self._change(seq, self.engine.load_checkpoint, body)

    # ---------------------------------------------------------------------------------------------
    # the group

    async def rendezvous(self) -> tuple[str, int]:
        """Where the process group meets: this node's address and a port free on it."""
        with socket.socket() as s:
            s.bind(("", 0))
            return _node_ip(), int(s.getsockname()[1])

    async def join_group(self, address: str, port: int, rank: int, world: int) -> None:
        """Leave the old process group (a member may have died) and join the new one: gloo on CPU,
        nccl on GPU. A group of one needs none."""

        def join() -> None:
            if dist.is_initialized():
                dist.destroy_process_group()
            if world > 1:
                backend = "nccl" if self.engine.device.type == "cuda" else "gloo"
                dist.init_process_group(
                    backend,
                    init_method=f"tcp://{address}:{port}",
                    rank=rank,
                    world_size=world,
                    timeout=GROUP_TIMEOUT,
                )
            self.world = world

        await self._run(self._on_compute, join)

    async def export_state(self) -> dict[str, Any]:
        """Everything another replica needs to become this one: the bases to make, every adapter
        (how to make it, its weights, optimizer state, version, learning rate), the RNG states, and
        the last change applied. Accumulated gradients are not part of it (see zero_grads)."""

        def export() -> dict[str, Any]:
            adapters = []
            for a in self.engine.adapters.values():
                spec = AdapterCreate(
                    name=a.name,
                    base=a.base.name,
                    kind=a.kind,
                    lora=a.lora,
                    optimizer=a.opt,
                    value_head_hidden=a.value_head_hidden,
                    seed=a.seed,
                )
                adapters.append(
                    {
                        "spec": spec,
                        "params": [_to_cpu(p) for p in a.params],
                        "optimizer": _to_cpu(a.optimizer.state_dict()),
                        "version": a.version,
                        "lr": a.lr,
                    }
                )
            rng = {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
            }
            return {"bases": list(self.bases), "adapters": adapters, "rng": rng, "applied": self.applied}

        return await self._run(self._on_compute, export)

    async def import_state(self, state: dict[str, Any]) -> None:
        """Become the replica that exported `state`: make the bases and adapters it has and this one
        lacks, drop the adapters it lacks, and copy every adapter's weights, optimizer state, version
        and learning rate, and the RNG states."""

        def load() -> None:
            registry = self.engine.registry
            for body in state["bases"]:
                if body.name not in registry.bases:
                    registry.create_base(body)
                    self.bases.append(body)
            wanted = {entry["spec"].name for entry in state["adapters"]}
            for name in [n for n in registry.adapters if n not in wanted]:
                registry.delete_adapter(name)
            device = registry.device
            for entry in state["adapters"]:
                spec: AdapterCreate = entry["spec"]
                a = registry.adapters.get(spec.name) or registry.create_adapter(spec)
                with torch.no_grad():
                    for p, value in zip(a.params, entry["params"], strict=True):
                        p.copy_(value.to(device))
                        p.grad = None
                a.optimizer.load_state_dict(entry["optimizer"])
                a.version = entry["version"]
                a.lr = entry["lr"]
            lora_batch.bump()
            torch.set_rng_state(state["rng"]["torch"])
            random.setstate(state["rng"]["python"])
            np.random.set_state(state["rng"]["numpy"])
            self.applied = state["applied"]

        await self._run(self._on_compute, load)


def _node_ip() -> str:
    import ray  # the actor runs under Ray; this module is imported without it elsewhere

    return ray.util.get_node_ip_address()
