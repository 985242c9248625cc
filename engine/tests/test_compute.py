"""The compute thread (compute.py): every engine call runs on it, between decode steps."""

from __future__ import annotations

import threading
import time

import pytest

from marft_engine.engine import Engine
from marft_engine.errors import EngineError
from marft_engine.registry import Base
from marft_engine.schemas import (
    Datum,
    ForwardRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)


def test_calls_are_let_in_between_decode_steps(engine: Engine) -> None:
    long = SamplingParams(max_new_tokens=600, ignore_eos=True)
    fut = engine.submit_sample(
        SampleBatch(requests=[SampleRequest(adapter="A", prompt_ids=[1, 2, 3], sampling=long)])
    )
    while "b" not in engine.sampler.running and not fut.done():
        time.sleep(0.001)
    engine.forward(ForwardRequest(adapter="B", data=[Datum(tokens=[1, 2, 3])]))
    assert not fut.done(), "forward waited for the whole sampling call"
    # a call that arrives mid-decode joins the running batch (continuous batching)
    engine.sampler.peak_batch = 0
    short = SamplingParams(max_new_tokens=5, n=3, ignore_eos=True)  # lengths are asserted: no early eos
    late = engine.sample(
        SampleBatch(requests=[SampleRequest(adapter="B", prompt_ids=[9] * 30, sampling=short)])
    )
    assert not fut.done() and engine.sampler.peak_batch == 4
    assert [len(c.response_ids) for c in late.results[0].completions] == [5, 5, 5]
    assert len(fut.result().results[0].completions[0].response_ids) == 600


def test_engine_calls_run_on_the_compute_thread(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every public call runs on the decode loop's thread (one OpenMP pool on a CPU); its errors reach
    the caller as if it had run the call itself."""
    seen: list[threading.Thread] = []
    info = Base.info

    def probe(self: Base) -> object:
        seen.append(threading.current_thread())
        return info(self)

    monkeypatch.setattr(Base, "info", probe)
    engine.list_bases()
    assert seen == [engine.compute.thread] and seen[0] is not threading.current_thread()
    with pytest.raises(EngineError, match="unknown adapter"):
        engine.delete_adapter("nope")
