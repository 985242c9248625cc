"""The engine the server calls: one method per endpoint, each run on the compute thread.

It only wires the parts together: the registry of bases and adapters (registry.py), the sampler
(sampler.py), which is the compute thread's background work (compute.py), forward and training passes
(training.py) and checkpoints (checkpoints.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import resource
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from . import checkpoints, lora_batch, training, training_batch
from .compute import ComputeThread, on_compute_thread
from .delays import Delays
from .errors import BadRequest
from .registry import Adapter, Base, Registry
from .sampler import Sampler
from .schemas import (
    AdapterCreate,
    AdapterInfo,
    AdapterList,
    BaseCreate,
    BaseInfo,
    BaseList,
    CheckpointRequest,
    CheckpointResponse,
    EndpointStats,
    ForwardBackwardBatch,
    ForwardBackwardBatchResponse,
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


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    return torch.device(device)


class Engine:
    def __init__(self, device: str = "auto", max_batch: int = 64, checkpoint_root: str | None = None) -> None:
        """`checkpoint_root`: the directory every checkpoint path must lie in (default ./runs)."""
        # model loading's progress bars and advice would fill the engine's log (stderr)
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        lora_batch.install()
        self.device = resolve_device(device)
        self.device_name = str(self.device)
        self.registry = Registry(self.device)
        self.sampler = Sampler(self.registry, max_batch)
        self.compute = ComputeThread(self.sampler)
        self.compute.before = delays.before if (delays := Delays.from_env()) else None
        self.tokens_trained = 0
        self.checkpoint_root = Path(checkpoint_root if checkpoint_root is not None else "runs").absolute()

    def progress(self) -> Progress:
        """Read off the compute thread (health answers while a long call runs)."""
        return Progress(beats=self.compute.beats, compute_cpu_seconds=self.compute.cpu_seconds())

    def close(self) -> None:
        self.compute.close()

    @property
    def bases(self) -> dict[str, Base]:
        return self.registry.bases

    @property
    def adapters(self) -> dict[str, Adapter]:
        return self.registry.adapters

    @on_compute_thread
    def create_base(self, body: BaseCreate) -> BaseInfo:
        return self.registry.create_base(body).info()

    @on_compute_thread
    def list_bases(self) -> BaseList:
        return BaseList(bases=[b.info() for b in self.bases.values()])

    @on_compute_thread
    def create_adapter(self, body: AdapterCreate) -> AdapterInfo:
        return self.registry.create_adapter(body).info()

    @on_compute_thread
    def list_adapters(self) -> AdapterList:
        return AdapterList(adapters=[a.info() for a in self.adapters.values()])

    @on_compute_thread
    def delete_adapter(self, name: str) -> AdapterInfo:
        return self.registry.delete_adapter(name)

    def sample(self, body: SampleBatch) -> SampleResponse:
        return self.submit_sample(body).result()

    @on_compute_thread
    def submit_sample(self, body: SampleBatch) -> concurrent.futures.Future[SampleResponse]:
        """Admit the call's rows to the decode loop; the future resolves when all are done."""
        return self.sampler.submit(body)

    @on_compute_thread
    def forward(self, body: ForwardRequest) -> ForwardResponse:
        return training.forward(self.registry, body)

    @on_compute_thread
    def forward_backward(
        self, body: ForwardBackwardRequest, call: CallTotals | None = None
    ) -> ForwardBackwardResponse:
        """`call`: the body is a shard of a larger call with these totals (replicas.py)."""
        out = training.forward_backward(self.registry, body, call)
        self.tokens_trained += out.num_tokens
        return out

    @on_compute_thread
    def forward_backward_batch(self, body: ForwardBackwardBatch) -> ForwardBackwardBatchResponse:
        out = training_batch.forward_backward_batch(self.registry, body)
        self.tokens_trained += sum(r.num_tokens for r in out.results)
        return out

    @on_compute_thread
    def retokenize(self, body: RetokenizeRequest) -> RetokenizeResponse:
        src = self.registry.get_base(body.from_base, "from_base")
        dst = self.registry.get_base(body.to_base, "to_base")
        for i, seq in enumerate(body.ids):
            for j, t in enumerate(seq):
                if not 0 <= t < src.vocab_size:
                    raise BadRequest(f"ids[{i}][{j}]: token id {t} is outside the vocabulary of {src.name!r}")
        texts = [src.tokenizer.decode(seq, skip_special_tokens=False) for seq in body.ids]
        return RetokenizeResponse(
            ids=[
                [int(t) for t in dst.tokenizer(text, add_special_tokens=False)["input_ids"]] for text in texts
            ]
        )

    @on_compute_thread
    def optim_step(self, body: OptimStepRequest) -> OptimStepResponse:
        return training.optim_step(self.registry, body)

    @on_compute_thread
    def save_checkpoint(self, body: CheckpointRequest) -> CheckpointResponse:
        return checkpoints.save(self.registry, self.checkpoint_root, body)

    @on_compute_thread
    def load_checkpoint(self, body: CheckpointRequest) -> CheckpointResponse:
        return checkpoints.load(self.registry, self.checkpoint_root, body)

    @on_compute_thread
    def stats(self, endpoints: dict[str, tuple[int, float]]) -> Stats:
        cuda = self.device.type == "cuda"
        return Stats(
            device=self.device_name,
            rss_bytes=_rss_bytes(),
            cuda_allocated_bytes=torch.cuda.memory_allocated() if cuda else None,
            cuda_max_allocated_bytes=torch.cuda.max_memory_allocated() if cuda else None,
            tokens_sampled=self.sampler.tokens_sampled,
            tokens_trained=self.tokens_trained,
            decode_steps=self.sampler.decode_steps,
            decode_rows=self.sampler.decode_rows,
            prefill_seconds=self.sampler.prefill_seconds,
            decode_seconds=self.sampler.decode_seconds,
            drafted_tokens=self.sampler.drafted_tokens,
            accepted_drafts=self.sampler.accepted_drafts,
            endpoints={k: EndpointStats(calls=c, seconds=s) for k, (c, s) in sorted(endpoints.items())},
            prefix_cache=self.sampler.prefix_stats(),
        )


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
