"""Several engine replicas on a local Ray cluster (replicas.py): 2 replicas of 1 thread each, CPU, the
tiny model, against one in-process engine given the same calls.

- a data-parallel step over 2 replicas equals one engine's step over the whole batch (within TOL),
  and leaves the replicas' adapters and optimizer states identical;
- sample calls are spread over the replicas (a call of several seeded requests cut into a part per
  replica), and their tokens are one engine's;
- a replica killed mid-run (with gradients accumulated and samples in flight) is replaced, and the
  run's results are one engine's: nothing lost, nothing applied twice;
- the tests run in file order on one group; the last one kills every replica.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from helpers import TARGETS, ppo_data

from marft_engine.engine import Engine
from marft_engine.errors import BadRequest, Unavailable
from marft_engine.replicas import ReplicaGroup, ReplicaOptions
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    CheckpointRequest,
    Datum,
    ForwardBackwardBatch,
    ForwardBackwardRequest,
    LoraConfig,
    OptimizerConfig,
    OptimStepRequest,
    PPOConfig,
    RetokenizeRequest,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)

# Shards and the whole batch differ by fp32 summation order (and micro-batches padded to other
# lengths): gradients, losses and stats within TOL of their scale (measured: gradients 2e-7).
TOL = 1e-5
# Parameters after AdamW steps: Adam moves each element by about lr whatever the size of its
# gradient, so an element whose gradient is at rounding level (1e-7 of the largest) can move
# differently. Measured with lr 1e-2: up to 1e-5, identical on one engine fed the same shards.
TOL_PARAMS = 1e-4
Target = Engine | ReplicaGroup


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[ReplicaGroup, Engine]]:
    lost = threading.Event()
    root = tempfile.gettempdir()  # checkpoints go to pytest's tmp_path
    options = ReplicaOptions(replicas=2, device="cpu", cpus=1, threads=1, checkpoint_root=root)
    group = ReplicaGroup(options, on_lost=lost.set)
    group.lost_event = lost  # type: ignore[attr-defined]
    one = Engine(device="cpu", checkpoint_root=root)
    for e in (group, one):
        e.create_base(BaseCreate(name="b", source="tiny:llama", seed=0, dtype="float32"))
    yield group, one
    group.close()
    one.close()


def both(pair: tuple[ReplicaGroup, Engine], method: str, *args: Any) -> tuple[Any, Any]:
    group, one = pair
    return getattr(group, method)(*args), getattr(one, method)(*args)


def policy(name: str, seed: int, kind: str = "policy") -> AdapterCreate:
    return AdapterCreate(
        name=name,
        base="b",
        kind=kind,  # type: ignore[arg-type]
        lora=LoraConfig(r=4, alpha=8, target_modules=TARGETS),
        optimizer=OptimizerConfig(lr=1e-2),
        value_head_hidden=[16] if kind == "critic" else [],
        seed=seed,
    )


def states(group: ReplicaGroup) -> list[dict[str, Any]]:
    return ray.get([s.call("export_state") for s in group.slots])


def params_of(state: dict[str, Any], name: str) -> list[torch.Tensor]:
    return next(a["params"] for a in state["adapters"] if a["spec"].name == name)


def assert_replicas_identical(group: ReplicaGroup) -> None:
    first, *rest = states(group)
    for other in rest:
        for a, b in zip(first["adapters"], other["adapters"], strict=True):
            assert a["spec"] == b["spec"] and a["version"] == b["version"]
            assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))
            sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
            assert sa.keys() == sb.keys()
            for k in sa:
                assert all(torch.equal(sa[k][f], sb[k][f]) for f in ("exp_avg", "exp_avg_sq", "step"))


def assert_matches_one_engine(group: ReplicaGroup, one: Engine, name: str) -> None:
    expect = [p.detach() for p in one.adapters[name].params]
    got = params_of(states(group)[0], name)
    for a, b in zip(expect, got, strict=True):
        assert float((a - b).abs().max()) <= TOL_PARAMS, name


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


def test_a_data_parallel_step_equals_one_engines_step(pair: tuple[ReplicaGroup, Engine]) -> None:
    group, one = pair
    both(pair, "create_adapter", policy("dp", 1))
    both(pair, "create_adapter", policy("dpc", 2, kind="critic"))
    for k, ppo in enumerate([PPOConfig(), PPOConfig(aggregation="token-sum", kl_coef=0.1)]):
        body = ForwardBackwardRequest(adapter="dp", loss="ppo", data=ppo_data(one, "dp", 10 + k), ppo=ppo)
        got, expect = both(pair, "forward_backward", body)
        assert close(got.loss, expect.loss)
        for key, v in expect.stats.items():
            if key != "micro_batches":  # each replica's shard is a micro-batch of its own
                assert close(got.stats[key], v), key
        # the replicas' gradients (their shards') add up to one engine's over the whole batch
        shard_grads = ray.get([s.call("grads", "dp") for s in group.slots])
        for i, p in enumerate(one.adapters["dp"].params):
            summed = sum(g[i] for g in shard_grads if g[i] is not None)
            assert p.grad is not None and all(g[i] is not None for g in shard_grads)
            assert float((summed - p.grad).abs().max()) <= TOL * float(p.grad.abs().max())
        got, expect = both(pair, "optim_step", OptimStepRequest(adapter="dp"))
        assert got.version == expect.version == k + 1
        assert close(got.grad_norm, expect.grad_norm)
    vdata = [
        Datum(tokens=d.tokens, returns=d.advantages, old_values=[0.1] * len(d.tokens)) for d in body.data
    ]
    got, expect = both(
        pair, "forward_backward", ForwardBackwardRequest(adapter="dpc", loss="value", data=vdata)
    )
    assert close(got.stats["explained_variance"], expect.stats["explained_variance"])
    both(pair, "optim_step", OptimStepRequest(adapter="dpc"))
    for name in ("dp", "dpc"):
        assert_matches_one_engine(group, one, name)
    assert_replicas_identical(group)
    # both replicas trained: each computed its shard of every call
    assert all(r.tokens_trained > 0 for r in group.stats({}).replicas or [])


def test_gpus_per_replica_follow_the_cluster(pair: tuple[ReplicaGroup, Engine]) -> None:
    """Without engine.replica.gpus: a GPU each where the cluster (here the test's local one, no GPU)
    has one for every replica, else none; a CPU engine never asks for one."""
    gpus = ray.cluster_resources().get("GPU", 0.0)
    assert ReplicaOptions(replicas=2, device="auto").gpus_per_replica() == (1.0 if gpus >= 2 else 0.0)
    assert ReplicaOptions(replicas=2, device="cpu").gpus_per_replica() == 0.0
    assert ReplicaOptions(replicas=2, device="cuda", gpus=0.5).gpus_per_replica() == 0.5


def sample_body(adapter: str, seed: int, tokens: int = 24) -> SampleBatch:
    return SampleBatch(
        requests=[
            SampleRequest(
                adapter=adapter,
                prompt_ids=[1, 2, 3 + seed % 50],
                seed=seed,
                sampling=SamplingParams(temperature=1.0, max_new_tokens=tokens, ignore_eos=True),
            )
        ]
    )


def test_sample_calls_are_spread_and_match_one_engine(pair: tuple[ReplicaGroup, Engine]) -> None:
    group, one = pair
    before = [r.sample_calls for r in group.stats({}).replicas or []]
    futures = [group.submit_sample(sample_body("dp", s)) for s in range(6)]
    got = [f.result(timeout=300) for f in futures]
    expect = [one.sample(sample_body("dp", s)) for s in range(6)]
    for g, e in zip(got, expect, strict=True):
        assert g.results[0].completions[0].response_ids == e.results[0].completions[0].response_ids
        assert g.results[0].adapter_version == e.results[0].adapter_version
    after = [r.sample_calls for r in group.stats({}).replicas or []]
    assert [a - b for a, b in zip(after, before, strict=True)] == [3, 3]


def test_a_call_of_several_seeded_requests_samples_on_every_replica(
    pair: tuple[ReplicaGroup, Engine],
) -> None:
    """The lock-step rollout's one call per round: cut into a part per replica, answered in request
    order with one engine's tokens; a part's refusal names the whole call's request."""
    group, one = pair
    body = SampleBatch(requests=[r for s in range(4) for r in sample_body("dp", 200 + s).requests], seed=5)
    before = [r.sample_calls for r in group.stats({}).replicas or []]
    got, expect = both(pair, "sample", body)
    after = [r.sample_calls for r in group.stats({}).replicas or []]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    assert [r.completions[0].response_ids for r in got.results] == [
        r.completions[0].response_ids for r in expect.results
    ]
    assert got.tokens_sampled == expect.tokens_sampled
    bad = body.model_copy(deep=True)
    bad.requests[3].prompt_ids = [1, 9999]
    with pytest.raises(BadRequest, match=r"^requests\[3\]\.prompt_ids\[1\]: token id 9999"):
        group.sample(bad)


def test_a_refused_shard_changes_nothing(pair: tuple[ReplicaGroup, Engine]) -> None:
    group, one = pair
    data = ppo_data(one, "dp", 20)
    bad = data[:-1] + [data[-1].model_copy(update={"tokens": [1, 9999, *data[-1].tokens[2:]]})]
    good = ForwardBackwardRequest(adapter="dp", loss="ppo", data=data)
    both(pair, "forward_backward", good)
    with pytest.raises(BadRequest, match=rf"^data\[{len(data) - 1}\]\.tokens\[1\]: token id 9999"):
        group.forward_backward(good.model_copy(update={"data": bad}))  # the first shard was accepted
    both(pair, "optim_step", OptimStepRequest(adapter="dp"))
    assert_matches_one_engine(group, one, "dp")


def kill(group: ReplicaGroup, index: int) -> None:
    os.kill(group.slots[index].pid, signal.SIGKILL)


def test_a_killed_replica_is_replaced_and_nothing_is_lost(pair: tuple[ReplicaGroup, Engine]) -> None:
    group, one = pair
    both(pair, "create_adapter", policy("k", 3))
    first = ForwardBackwardRequest(adapter="k", loss="ppo", data=ppo_data(one, "k", 30))
    both(pair, "forward_backward", first)  # gradients accumulated on both replicas
    # two long sample calls in flight, one per replica; replica 1 dies under its call
    futures = [group.submit_sample(sample_body("k", s, tokens=200)) for s in (100, 101)]
    while not all(s.rows for s in group.slots):
        time.sleep(0.05)
    kill(group, 1)
    for f, s in zip(futures, (100, 101), strict=True):
        expect = one.sample(sample_body("k", s, tokens=200)).results[0]
        got = f.result(timeout=600).results[0]
        assert got.completions[0].response_ids == expect.completions[0].response_ids
        assert got.adapter_version == expect.adapter_version == 0
    second = ForwardBackwardRequest(adapter="k", loss="ppo", data=ppo_data(one, "k", 31))
    got, expect = both(pair, "forward_backward", second)
    assert close(got.loss, expect.loss)
    got, expect = both(pair, "optim_step", OptimStepRequest(adapter="k"))
    assert got.version == expect.version == 1  # applied once
    assert close(got.grad_norm, expect.grad_norm)  # both calls' gradients, each once
    assert_matches_one_engine(group, one, "k")
    assert_replicas_identical(group)
    assert [s.restarts for s in group.slots] == [0, 1]


def test_a_change_a_survivor_applied_counts_as_done(pair: tuple[ReplicaGroup, Engine]) -> None:
    """A change that reached replica 0 but not replica 1, which then died: the repair takes replica 0's
    state (the change included) and answers with replica 0's answer; it is not applied again."""
    group, one = pair
    group.seq += 1
    body = policy("late", 4)
    applied = ray.get(group.slots[0].call("create_adapter", group.seq, body))
    one.create_adapter(body)
    kill(group, 1)
    with group.lock:
        assert group._rebuild(group.seq, None) == applied
    for s in group.slots:
        assert "late" in [a.name for a in ray.get(s.call("list_adapters")).adapters]
    assert_replicas_identical(group)
    assert_matches_one_engine(group, one, "late")


def test_the_front_serves_batches_retokenizing_and_progress(pair: tuple[ReplicaGroup, Engine]) -> None:
    """What one engine answers beyond the basics: a forward_backward_batch is each call's sharded
    forward_backward (same stats as one engine's call), retokenize answers from a replica, and the
    health progress of the replicas moves with their work."""
    group, one = pair
    for e in (group, one):
        e.create_adapter(policy("fb1", 21))
        e.create_adapter(policy("fb2", 22))
    calls = [
        ForwardBackwardRequest(adapter=a, loss="ppo", data=ppo_data(one, a, s))
        for a, s in (("fb1", 5), ("fb2", 6))
    ]
    before = group.progress()
    got = group.forward_backward_batch(ForwardBackwardBatch(calls=calls))
    want = [one.forward_backward(c) for c in calls]
    for g, w in zip(got.results, want, strict=True):
        assert close(g.loss, w.loss) and g.num_data == w.num_data
        assert close(g.stats["clipfrac"], w.stats["clipfrac"]) and close(
            g.stats["approx_kl"], w.stats["approx_kl"]
        )
    after = group.progress()
    assert after.beats > before.beats and after.compute_cpu_seconds >= before.compute_cpu_seconds
    ids = [[5, 6, 7]]
    body = RetokenizeRequest(from_base="b", to_base="b", ids=ids)
    assert group.retokenize(body).ids == one.retokenize(body).ids
    for e in (group, one):
        for a in ("fb1", "fb2"):
            e.delete_adapter(a)  # their gradients are not stepped: later tests start clean


def test_checkpoints_are_written_once_and_loaded_by_all(
    pair: tuple[ReplicaGroup, Engine], tmp_path: os.PathLike[str]
) -> None:
    group, one = pair
    path = str(tmp_path) + "/ckpt"
    group.save_checkpoint(CheckpointRequest(path=path, adapters=["k"]))
    saved = params_of(states(group)[0], "k")
    body = ForwardBackwardRequest(adapter="k", loss="ppo", data=ppo_data(one, "k", 40))
    group.forward_backward(body)
    group.optim_step(OptimStepRequest(adapter="k"))

    def version() -> int:
        return {a.name: a.version for a in group.list_adapters().adapters}["k"]

    assert version() == 2
    group.load_checkpoint(CheckpointRequest(path=path))
    assert version() == 1
    for state in states(group):
        assert all(torch.equal(a, b) for a, b in zip(saved, params_of(state, "k"), strict=True))
    assert_replicas_identical(group)


def test_when_every_replica_dies_the_group_gives_up(pair: tuple[ReplicaGroup, Engine]) -> None:
    group, _ = pair
    for i in range(len(group.slots)):
        kill(group, i)
    with pytest.raises(Unavailable, match="every replica"):
        group.optim_step(OptimStepRequest(adapter="k"))
    assert group.lost_event.is_set()  # type: ignore[attr-defined]
