"""One forward / forward_backward call's data cut into shards for data-parallel replicas, one sample
call's requests cut into parts for the sampling replicas, and the answers put back together
(replicas.py). Torch-free: the front process that spreads calls over the replicas imports no torch.

A forward_backward shard is computed with the whole call's normalisers (`CallTotals`), so its loss,
gradients and weighted-mean stats are its share of the call's and add up to the call's exactly (up to
float summation order). The figures that are not sums (the value loss's variances) are computed
once, from the sums (`SUMMARIES`).
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .schemas import (
    Datum,
    ForwardBackwardRequest,
    ForwardBackwardResponse,
    ForwardResponse,
    SampleBatch,
    SampleResponse,
)


@dataclass(frozen=True)
class CallTotals:
    """The normalisers of a whole forward_backward call, given to each shard of its data: the call's
    total weight and number of data (training.forward_backward)."""

    weight: float
    data: int


def value_summary(stats: dict[str, float]) -> None:
    """Weighted means of squares -> the variances and explained variance they give."""
    mean_r = stats["return_mean"]
    var_r = stats.pop("return_sq") - mean_r**2
    mean_res = stats.pop("residual")
    var_res = stats.pop("residual_sq") - mean_res**2
    stats["return_var"] = var_r
    stats["residual_var"] = var_res
    stats["explained_variance"] = 1.0 - var_res / var_r if var_r > 1e-12 else 0.0


# loss name -> the summary training.LOSSES gives it (a test checks the two agree)
SUMMARIES: dict[str, Callable[[dict[str, float]], None]] = {"value": value_summary}


def weights(d: Datum) -> list[float]:
    """A datum's weights (default: every token but the first), as training.py reads them."""
    return d.weights if d.weights is not None else [0.0] + [1.0] * (len(d.tokens) - 1)


def call_totals(data: list[Datum]) -> CallTotals:
    return CallTotals(weight=float(sum(sum(weights(d)) for d in data)), data=len(data))


def _runs(sizes: list[int], parts: int) -> list[range]:
    """At most `parts` non-empty runs of consecutive items with about equal sums of `sizes`."""
    parts = max(1, min(parts, len(sizes)))
    total = sum(sizes)
    runs: list[range] = []
    start = seen = 0
    for i, n in enumerate(sizes):
        seen += n
        runs_after = parts - len(runs) - 1  # runs still to start after the current one
        items_after = len(sizes) - i - 1
        if runs_after > 0 and (seen >= total * (len(runs) + 1) / parts or items_after == runs_after):
            runs.append(range(start, i + 1))
            start = i + 1
    runs.append(range(start, len(sizes)))
    return runs


def split(data: list[Datum], parts: int) -> list[range]:
    """At most `parts` non-empty runs of consecutive data with about equal token counts (compute
    grows with tokens; runs of consecutive data put the answers back in order)."""
    return _runs([len(d.tokens) for d in data], parts)


def shard_request(body: ForwardBackwardRequest, run: range) -> ForwardBackwardRequest:
    return body.model_copy(update={"data": body.data[run.start : run.stop]})


def merge_forward_backward(loss: str, answers: list[ForwardBackwardResponse]) -> ForwardBackwardResponse:
    """The call's answer from its shards' (each computed with the call's CallTotals)."""
    stats: dict[str, float] = {}
    for a in answers:
        for k, v in a.stats.items():
            stats[k] = stats.get(k, 0.0) + v
    summary = SUMMARIES.get(loss)
    if summary is not None:
        summary(stats)
    return ForwardBackwardResponse(
        loss=sum(a.loss for a in answers),
        stats=stats,
        num_data=sum(a.num_data for a in answers),
        num_tokens=sum(a.num_tokens for a in answers),
    )


def merge_forward(answers: list[ForwardResponse]) -> ForwardResponse:
    return ForwardResponse(results=[r for a in answers for r in a.results])


def split_sample(body: SampleBatch, parts: int) -> list[range]:
    """At most `parts` runs of consecutive requests with about equal rows, each to be sampled on a
    replica of its own; one run (the call whole) unless every request has its own seed. A request's
    tokens then depend on its seed alone, not on the call it is in (sampler.py); a request without
    one is seeded from the call's seed and its index in the call, which a part would change."""
    if parts <= 1 or len(body.requests) < 2 or any(r.seed is None for r in body.requests):
        return [range(len(body.requests))]
    return _runs([r.sampling.n for r in body.requests], parts)


def sample_part(body: SampleBatch, run: range) -> SampleBatch:
    return body.model_copy(update={"requests": body.requests[run.start : run.stop]})


def merge_sample(answers: list[SampleResponse]) -> SampleResponse:
    """The call's answer from its parts' (sampled at the same time: the call took the longest one)."""
    return SampleResponse(
        results=[r for a in answers for r in a.results],
        tokens_sampled=sum(a.tokens_sampled for a in answers),
        seconds=max(a.seconds for a in answers),
    )


_INDEX = re.compile(r"\b(data|requests)\[(\d+)\]")


def whole_call_message(message: str, offset: int) -> str:
    """A shard's refusal, with its data or request indices ("data[3].tokens: ...",
    "requests[1].adapter: ...") made the whole call's."""
    return _INDEX.sub(lambda m: f"{m[1]}[{int(m[2]) + offset}]", message)


def joined_sample(
    parts: list[concurrent.futures.Future[SampleResponse]],
) -> concurrent.futures.Future[SampleResponse]:
    """One sample call's answer from its parts' (its first refusal or failure, if any)."""
    out: concurrent.futures.Future[SampleResponse] = concurrent.futures.Future()
    left = [len(parts)]
    lock = threading.Lock()

    def done(_: concurrent.futures.Future[SampleResponse]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        failed = next((p.exception() for p in parts if p.exception() is not None), None)
        if failed is not None:
            out.set_exception(failed)
        else:
            out.set_result(merge_sample([p.result() for p in parts]))

    for p in parts:
        p.add_done_callback(done)
    return out
