"""Engine behaviour on the tiny model: isolation, reference, parity, accumulation, batching, checkpoints."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import peft
import pytest
import torch
from helpers import add_policy

from marft_engine import kv_cache, losses
from marft_engine.engine import Base, Engine
from marft_engine.errors import EngineError
from marft_engine.kv_cache import SLACK, Running
from marft_engine.models import load_tiny
from marft_engine.sampler import Row
from marft_engine.schemas import (
    AdapterCreate,
    BaseCreate,
    ChatMessage,
    CheckpointRequest,
    Datum,
    ForwardBackwardRequest,
    ForwardRequest,
    LoraConfig,
    OptimStepRequest,
    PPOConfig,
    SampleBatch,
    SampleRequest,
    SamplingParams,
)

PARITY_TOL = 1e-4  # CPU fp32: sample (KV cache, left padding) vs forward (full sequence, right padding)


def seqs(n: int, seed: int, lo: int = 5, hi: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi, (1,), generator=g))
        out.append(torch.randint(0, 256, (length,), generator=g).tolist())
    return out


def ppo_data(engine: Engine, adapter: str, seed: int, n: int = 6) -> list[Datum]:
    data = [Datum(tokens=s) for s in seqs(n, seed)]
    old = engine.forward(ForwardRequest(adapter=adapter, data=data)).results
    g = torch.Generator().manual_seed(seed + 1)
    return [
        Datum(
            tokens=d.tokens,
            weights=[0.0] + [1.0] * (len(d.tokens) - 1),
            old_logprobs=[x + 0.3 * float(torch.randn(1, generator=g)) for x in r.logprobs],
            advantages=torch.randn(len(d.tokens), generator=g).tolist(),
        )
        for d, r in zip(data, old, strict=True)
    ]


def snapshot(engine: Engine) -> dict[str, torch.Tensor]:
    """Every tensor the engine holds: base, all LoRA weights, value heads."""
    out = {n: p.detach().clone() for n, p in engine.bases["b"].hf.named_parameters()}
    for name, a in engine.adapters.items():
        if a.value_head is not None:
            out.update({f"{name}.head.{k}": v.clone() for k, v in a.value_head.state_dict().items()})
    return out


def test_adapter_isolation(engine: Engine) -> None:
    before = snapshot(engine)
    ids_a = {id(p) for p in engine.adapters["A"].params}
    names_a = {n for n, p in engine.bases["b"].hf.named_parameters() if id(p) in ids_a}
    assert names_a
    engine.forward_backward(ForwardBackwardRequest(adapter="A", loss="ppo", data=ppo_data(engine, "A", 1)))
    engine.optim_step(OptimStepRequest(adapter="A"))
    after = snapshot(engine)
    for n in before:
        if n in names_a:
            continue
        assert torch.equal(before[n], after[n]), f"{n} changed by a step on A"
    assert any(not torch.equal(before[n], after[n]) for n in names_a), "A did not change"
    # and the same for a critic step
    before = after
    data = [Datum(tokens=s, returns=[1.0] * len(s), old_values=[0.0] * len(s)) for s in seqs(3, 5)]
    engine.forward_backward(ForwardBackwardRequest(adapter="C", loss="value", data=data))
    engine.optim_step(OptimStepRequest(adapter="C"))
    after = snapshot(engine)
    ids_c = {id(p) for p in engine.adapters["C"].params}
    names_c = {n for n, p in engine.bases["b"].hf.named_parameters() if id(p) in ids_c}
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= names_c | {n for n in before if n.startswith("C.head.")}


def test_reference_is_the_plain_base_model(engine: Engine) -> None:
    plain, _ = load_tiny("llama", 0)
    data = seqs(3, 7)
    res = engine.forward(
        ForwardRequest(adapter="__base__", base="b", data=[Datum(tokens=s) for s in data], temperature=0.7)
    )
    for s, r in zip(data, res.results, strict=True):
        ids = torch.tensor([s])
        with torch.no_grad():
            expect = losses.token_logprobs(plain(ids).logits, ids, 0.7)[0]
        assert torch.allclose(torch.tensor(r.logprobs), expect, atol=1e-6)
        assert r.logprobs[0] == 0.0
    # ...and an adapter really differs from it
    other = engine.forward(ForwardRequest(adapter="B", data=[Datum(tokens=data[0])], temperature=0.7))
    assert (
        max(abs(x - y) for x, y in zip(other.results[0].logprobs, res.results[0].logprobs, strict=True))
        > 1e-3
    )


def test_sample_parity_with_forward_mixed_adapters_and_temperatures(engine: Engine) -> None:
    cases = [
        ("A", SamplingParams(temperature=1.0, max_new_tokens=12, n=2)),
        ("B", SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=9)),
        ("__base__", SamplingParams(temperature=1.3, top_k=20, max_new_tokens=7)),
        ("A", SamplingParams(temperature=0.0, max_new_tokens=10)),
    ]
    reqs = [
        SampleRequest(adapter=a, base="b", prompt_ids=s, sampling=sp)
        for (a, sp), s in zip(cases, seqs(len(cases), 11, 3, 15), strict=True)
    ]
    out = engine.sample(SampleBatch(requests=reqs, seed=3))
    for (a, sp), res in zip(cases, out.results, strict=True):
        assert res.adapter == a and res.adapter_version == (
            engine.adapters[a].version if a != "__base__" else 0
        )
        assert len(res.completions) == sp.n
        for c in res.completions:
            assert len(c.response_ids) == len(c.logprobs) == len(c.sampler_logprobs) == sp.max_new_tokens
            toks = res.prompt_ids + c.response_ids
            t = sp.temperature if sp.temperature > 0 else 1.0
            f = engine.forward(ForwardRequest(adapter=a, base="b", data=[Datum(tokens=toks)], temperature=t))
            got = torch.tensor(f.results[0].logprobs[len(res.prompt_ids) :])
            assert torch.allclose(got, torch.tensor(c.logprobs), atol=PARITY_TOL), (a, sp)
            if sp.temperature == 0:
                assert c.sampler_logprobs == [0.0] * len(c.response_ids)
            elif sp.top_k == 0 and sp.top_p == 1:
                assert c.sampler_logprobs == c.logprobs
            else:  # truncation renormalises: the sampled token is at least as likely under the sampler
                assert all(s >= p - 1e-6 for s, p in zip(c.sampler_logprobs, c.logprobs, strict=True))


def test_sampled_tokens_follow_the_tempered_policy(engine: Engine) -> None:
    """Full-vocabulary sampling draws tokens with the policy's probabilities: 4000 one-token samples
    against the policy's probabilities from forward passes, every token of probability > 1% within 4.5
    standard errors (an off-by-one in the inverse CDF or a biased draw moves whole classes)."""
    prompt = [7, 100, 42, 9]
    T, n = 0.1, 4000  # the tiny model is near-uniform: a low temperature gives it likely tokens
    sp = SamplingParams(temperature=T, max_new_tokens=1, n=n // 16)
    req = SampleRequest(adapter="__base__", base="b", prompt_ids=prompt, sampling=sp)
    res = engine.sample(SampleBatch(requests=[req] * 16, seed=5)).results
    completions = [c for r in res for c in r.completions]
    vocab = engine.bases["b"].vocab_size
    got = torch.bincount(torch.tensor([c.response_ids[0] for c in completions]), minlength=vocab)
    every = [Datum(tokens=[*prompt, t]) for t in range(vocab)]
    f = engine.forward(ForwardRequest(adapter="__base__", base="b", data=every, temperature=T))
    p = torch.tensor([r.logprobs[-1] for r in f.results]).exp()  # [V] the tempered policy
    assert abs(float(p.sum()) - 1) < 1e-4
    assert int((p > 0.01).sum()) >= 3  # several likely tokens, so the test means something
    for t in torch.nonzero(p > 0.01)[:, 0].tolist():
        se = float((p[t] * (1 - p[t]) / n).sqrt())
        assert abs(float(got[t]) / n - float(p[t])) < 4.5 * se, (t, float(got[t]) / n, float(p[t]))
    for c in completions:  # the sampler is the policy itself here
        assert c.sampler_logprobs == c.logprobs


def test_mixed_adapter_batch_equals_separate_calls(engine: Engine) -> None:
    prompts = seqs(4, 21, 3, 12)
    adapters = ["A", "B", "__base__", "B"]
    for temperature in (0.0, 0.9):
        reqs = [
            SampleRequest(
                adapter=a,
                base="b",
                prompt_ids=p,
                seed=100 + i,
                sampling=SamplingParams(temperature=temperature, max_new_tokens=10, n=2),
            )
            for i, (a, p) in enumerate(zip(adapters, prompts, strict=True))
        ]
        mixed = engine.sample(SampleBatch(requests=reqs)).results
        for r, m in zip(reqs, mixed, strict=True):
            alone = engine.sample(SampleBatch(requests=[r])).results[0]
            assert [c.response_ids for c in alone.completions] == [c.response_ids for c in m.completions]
            for c1, c2 in zip(alone.completions, m.completions, strict=True):
                assert torch.allclose(torch.tensor(c1.logprobs), torch.tensor(c2.logprobs), atol=PARITY_TOL)
        if temperature > 0:  # different seeds do give different samples
            assert mixed[1].completions[0].response_ids != mixed[1].completions[1].response_ids


def test_sample_chat_stop_eos_and_n(engine: Engine) -> None:
    msgs = [ChatMessage(role="user", content="hello")]
    res = engine.sample(
        SampleBatch(
            requests=[SampleRequest(adapter="A", messages=msgs, sampling=SamplingParams(max_new_tokens=5))],
            seed=0,
        )
    ).results[0]
    tok = engine.bases["b"].tokenizer
    assert tok.decode(res.prompt_ids) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    # a stop string made of the byte the greedy row produces third: the ids end at that token
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    g = engine.sample(
        SampleBatch(requests=[SampleRequest(adapter="B", prompt_ids=[65, 66], sampling=greedy)])
    )
    ids = g.results[0].completions[0].response_ids
    stop_text = tok.decode(ids[2:3])
    first = tok.decode(ids).find(stop_text)
    sp = greedy.model_copy(update={"stop": [stop_text]})
    s = engine.sample(SampleBatch(requests=[SampleRequest(adapter="B", prompt_ids=[65, 66], sampling=sp)]))
    c = s.results[0].completions[0]
    assert c.finish_reason == "stop"
    assert c.text == tok.decode(ids)[:first]
    assert tok.decode(c.response_ids).endswith(stop_text)
    # eos: make eos the greedy choice by training-free means: ask the base for a row ending in eos
    eos = engine.bases["b"].eos_ids[0]
    f = engine.forward(ForwardRequest(adapter="B", data=[Datum(tokens=[65, 66, eos])]))
    assert f.results[0].logprobs[2] < 0  # defined for eos as any token


def test_microbatch_accumulation_equals_full_batch(engine: Engine) -> None:
    add_policy(engine, "acc", seed=9)
    data = ppo_data(engine, "acc", 31, n=7)
    params = engine.adapters["acc"].params

    def grads(**kw: object) -> list[torch.Tensor]:
        engine.forward_backward(ForwardBackwardRequest(adapter="acc", data=data, **kw))  # type: ignore[arg-type]
        g = [p.grad.clone() for p in params]
        engine.adapters["acc"].optimizer.zero_grad(set_to_none=True)
        return g

    for cfg in (
        PPOConfig(),
        PPOConfig(aggregation="token-sum", entropy_coef=0.01, kl_coef=0.1),
        PPOConfig(ratio="sequence", sequence_logprob="mean"),
    ):
        full = grads(loss="ppo", ppo=cfg, micro_batch_tokens=100000)
        small = grads(loss="ppo", ppo=cfg, micro_batch_tokens=20)
        for a, b in zip(full, small, strict=True):
            # fp32 sums in another order: equal up to rounding, relative to the gradient's scale
            assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max()), cfg
        assert sum(float(g.abs().sum()) for g in full) > 0
    r1 = engine.forward_backward(
        ForwardBackwardRequest(adapter="acc", loss="cross_entropy", data=data, micro_batch_tokens=20)
    )
    assert r1.stats["micro_batches"] >= 4
    engine.adapters["acc"].optimizer.zero_grad(set_to_none=True)
    # value loss on the critic
    vdata = [Datum(tokens=d.tokens, returns=d.advantages, old_values=[0.1] * len(d.tokens)) for d in data]
    cparams = engine.adapters["C"].params
    out = []
    for budget in (100000, 20):
        engine.forward_backward(
            ForwardBackwardRequest(adapter="C", loss="value", data=vdata, micro_batch_tokens=budget)
        )
        out.append([p.grad.clone() for p in cparams])
        engine.adapters["C"].optimizer.zero_grad(set_to_none=True)
    for a, b in zip(*out, strict=True):
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    engine.delete_adapter("acc")


def train_steps(engine: Engine, adapter: str, seed: int, steps: int) -> list[float]:
    for k in range(steps):
        data = ppo_data(engine, adapter, seed + k, n=3)
        engine.forward_backward(ForwardBackwardRequest(adapter=adapter, loss="ppo", data=data))
        engine.optim_step(OptimStepRequest(adapter=adapter))
    probe = [Datum(tokens=s) for s in seqs(2, 999)]
    res = engine.forward(ForwardRequest(adapter=adapter, data=probe)).results
    return [x for r in res for x in r.logprobs]


def test_checkpoint_round_trip_and_continued_training(engine: Engine, tmp_path: Path) -> None:
    add_policy(engine, "ck", seed=4)
    train_steps(engine, "ck", 50, 2)
    ck = tmp_path / "ckpt"
    engine.save_checkpoint(CheckpointRequest(path=str(ck), adapters=["ck", "C"]))
    assert sorted(p.name for p in (ck / "adapters" / "ck").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "optimizer.pt",
    ]
    assert (ck / "adapters" / "C" / "value_head.safetensors").is_file()
    assert not list(tmp_path.glob("*.tmp-*"))
    uninterrupted = train_steps(engine, "ck", 60, 2)
    assert engine.adapters["ck"].version == 4
    engine.load_checkpoint(CheckpointRequest(path=str(ck)))
    assert engine.adapters["ck"].version == 2
    resumed = train_steps(engine, "ck", 60, 2)
    assert resumed == uninterrupted  # bit for bit

    # a fresh engine creates the missing adapters on its already-loaded base
    fresh = Engine(device="cpu")
    try:
        fresh.create_base(BaseCreate(name="b", source="tiny:llama", seed=0))
        engine.load_checkpoint(CheckpointRequest(path=str(ck)))
        fresh.load_checkpoint(CheckpointRequest(path=str(ck)))
        assert fresh.adapters["C"].kind == "critic" and fresh.adapters["ck"].version == 2
        probe = [Datum(tokens=s) for s in seqs(2, 5)]
        for name in ("ck", "C"):
            a = engine.forward(ForwardRequest(adapter=name, data=probe)).results
            b = fresh.forward(ForwardRequest(adapter=name, data=probe)).results
            assert a == b
        assert train_steps(fresh, "ck", 60, 2) == resumed
    finally:
        fresh.close()

    # the PEFT folder loads with plain transformers + peft
    plain, _ = load_tiny("llama", 0)
    engine.load_checkpoint(CheckpointRequest(path=str(ck), adapters=["ck"]))
    pm = peft.PeftModel.from_pretrained(plain, str(ck / "adapters" / "ck")).eval()
    s = seqs(1, 77)[0]
    ids = torch.tensor([s])
    with torch.no_grad():
        expect = losses.token_logprobs(pm(ids).logits, ids, 1.0)[0]
    got = engine.forward(ForwardRequest(adapter="ck", data=[Datum(tokens=s)])).results[0].logprobs
    assert torch.allclose(torch.tensor(got), expect, atol=1e-6)
    # init_from a PEFT folder gives the same adapter
    engine.create_adapter(AdapterCreate(name="ck2", base="b", init_from=str(ck / "adapters" / "ck")))
    got2 = engine.forward(ForwardRequest(adapter="ck2", data=[Datum(tokens=s)])).results[0].logprobs
    assert got2 == got
    engine.delete_adapter("ck2")
    engine.delete_adapter("ck")


def test_critic_values_are_per_prefix(engine: Engine) -> None:
    s = seqs(1, 3, 10, 11)[0]
    full = engine.forward(ForwardRequest(adapter="C", data=[Datum(tokens=s)])).results[0].values
    assert full is not None and len(full) == len(s)
    for i in (2, 6):
        part = engine.forward(ForwardRequest(adapter="C", data=[Datum(tokens=s[: i + 1])])).results[0].values
        assert part is not None and part[-1] == pytest.approx(full[i], abs=1e-5)


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


def test_slot_cache_keeps_every_row_through_joins_leaves_and_relayouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decode batch's slot cache against a plain per-row record of what each row's cache holds,
    through joins (with prompts longer than the batch's: room made on the left), leaves (swap-remove),
    slot growth and re-layouts at the right edge; the attention mask marks exactly each row's tokens,
    a step's update returns the live rows' keys, and what attention reads is finite even though the
    buffers start as garbage (NaN here)."""

    def nan_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(kv_cache, "_uninitialised", nan_buffer)
    g = torch.Generator().manual_seed(0)
    H, D, layers = 2, 3, 2
    run: Running[Row] = Running(max_slots=6, dtype=torch.float64)
    want: dict[int, list[torch.Tensor]] = {}  # row id -> per layer [H, len, D] keys (values = -keys)
    rows: dict[int, Row] = {}
    next_id = 0

    def join(lengths: list[int]) -> None:
        nonlocal next_id
        Lp = max(lengths)
        kv = []
        for _ in range(layers):
            k = torch.randn(len(lengths), H, Lp, D, generator=g, dtype=torch.float32)
            kv.append((k, -k))
        new = []
        for j, p in enumerate(lengths):
            r = Row(
                job=None,
                req=next_id,
                k=0,
                prompt=[0] * p,
                adapter="a",
                params=None,
                generator=None,
                ignore_eos=False,
            )  # type: ignore[arg-type]
            rows[next_id], want[next_id] = r, [kv[li][0][j, :, Lp - p :].double() for li in range(layers)]
            new.append(r)
            next_id += 1
        run.add(new, kv, list(range(len(lengths))))

    def step() -> None:
        mask, pos = run.step_inputs(torch.device("cpu"))
        n = len(run.rows)
        for r, m, p in zip(run.rows, mask, pos[:, 0], strict=True):
            assert int(m.sum()) == want[r.req][0].shape[1] + 1 and bool(m[-1])  # its tokens + this one
            assert int(p) == want[r.req][0].shape[1]
        for li, layer in enumerate(run.cache.layers):
            new = torch.randn(n, H, 1, D, generator=g, dtype=torch.float64)
            k, v = layer.update(new, -new)
            assert k.shape == (n, H, mask.shape[1], D) and torch.equal(v, -k)
            assert torch.isfinite(k).all() and torch.isfinite(v).all()
            for i, r in enumerate(run.rows):
                want[r.req][li] = torch.cat([want[r.req][li], new[i]], dim=1)
        run.advance()

    def check() -> None:
        for i, r in enumerate(run.rows):
            f = run.first[i]
            assert run.end - f == want[r.req][0].shape[1]
            for li, layer in enumerate(run.layers):
                assert torch.equal(layer.kbuf[i, :, f : run.end], want[r.req][li])
                assert torch.equal(layer.vbuf[i, :, f : run.end], -want[r.req][li])

    join([3, 5])
    check()
    for t in range(3 * SLACK):  # crosses the right edge: re-layouts
        step()
        if t == 2:
            join([9, 1, 4])  # 9 > end: the cache is re-laid out with room on the left; slots grow
        if t == 5:
            run.remove([0, 3])  # swap-remove: the last rows move into slots 0 and 3
        if t == 7:
            join([2])
        if t == 30:
            run.remove([len(run.rows) - 1])
        check()
    assert sorted(r.req for r in run.rows) == [1, 2, 4]  # 0 and 3 left at t=5, 5 (joined at t=7) at t=30
    assert run.start == min(run.first)
    run.remove(list(range(len(run.rows))))
    assert run.rows == [] and run.first == [] and run.pos == []


def test_deleting_an_adapter_mid_decode_fails_its_call(engine: Engine) -> None:
    add_policy(engine, "doomed", seed=12)
    long = SamplingParams(max_new_tokens=600, ignore_eos=True)
    fut = engine.submit_sample(
        SampleBatch(requests=[SampleRequest(adapter="doomed", prompt_ids=[1], sampling=long)])
    )
    while "b" not in engine.sampler.running and not fut.done():
        time.sleep(0.001)
    engine.delete_adapter("doomed")
    with pytest.raises(EngineError) as err:
        fut.result(timeout=60)
    assert err.value.status == 409 and "deleted" in err.value.message


def test_two_bases_in_one_call(engine: Engine) -> None:
    engine.create_base(BaseCreate(name="q", source="tiny:qwen2", seed=5))
    try:
        add_policy(engine, "qa", base="q", seed=6)
        sp = SamplingParams(temperature=0, max_new_tokens=6)
        reqs = [
            SampleRequest(adapter="A", prompt_ids=[5, 6, 7], sampling=sp),
            SampleRequest(adapter="qa", prompt_ids=[5, 6, 7], sampling=sp),
        ]
        both = engine.sample(SampleBatch(requests=reqs)).results
        for r, res in zip(reqs, both, strict=True):
            assert res.completions == engine.sample(SampleBatch(requests=[r])).results[0].completions
        assert both[0].completions[0].response_ids != both[1].completions[0].response_ids
    finally:
        engine.delete_adapter("qa")
        del engine.bases["q"]


def test_hf_source_and_bad_sources(engine: Engine, tmp_path: Path) -> None:
    model, tok = load_tiny("qwen2", 3)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    engine.create_base(BaseCreate(name="hfb", source=f"hf:{tmp_path / 'm'}"))
    engine.create_base(BaseCreate(name="tq", source="tiny:qwen2", seed=3))
    try:
        probe = [Datum(tokens=s) for s in seqs(2, 8)]
        a = engine.forward(ForwardRequest(adapter="__base__", base="hfb", data=probe)).results
        b = engine.forward(ForwardRequest(adapter="__base__", base="tq", data=probe)).results
        assert a == b
        assert (
            engine.bases["hfb"]
            .tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
            )
            .endswith("<|im_start|>assistant\n")
        )
        for source in (f"hf:{tmp_path}", f"gguf:{tmp_path / 'none.gguf'}", "pkg:other", "s3:x"):
            with pytest.raises(EngineError) as err:
                engine.create_base(BaseCreate(name="bad", source=source))
            assert err.value.status == 400 and err.value.message.startswith("source:")
    finally:
        del engine.bases["hfb"], engine.bases["tq"]


def test_deleting_the_last_adapter_of_a_base_leaves_a_working_base(engine: Engine) -> None:
    engine.create_base(BaseCreate(name="solo", source="tiny:llama", seed=0))
    try:
        probe = [Datum(tokens=[1, 2, 3, 4])]
        before = engine.forward(ForwardRequest(adapter="__base__", base="solo", data=probe)).results
        add_policy(engine, "only", base="solo", seed=8)
        engine.delete_adapter("only")
        assert engine.forward(ForwardRequest(adapter="__base__", base="solo", data=probe)).results == before
        sp = SamplingParams(temperature=0, max_new_tokens=3)
        out = engine.sample(
            SampleBatch(
                requests=[SampleRequest(adapter="__base__", base="solo", prompt_ids=[1], sampling=sp)]
            )
        )
        assert len(out.results[0].completions[0].response_ids) == 3
        add_policy(engine, "only", base="solo", seed=8)
        assert engine.forward(ForwardRequest(adapter="only", data=probe)).results != before
        engine.delete_adapter("only")
    finally:
        del engine.bases["solo"]


def test_head_on_weighted_positions_only_equals_full_logits(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss runs the LM head only where weights > 0 (prompts cost no vocabulary-wide work);
    the loss, its stats and its gradient equal the full-logits computation's."""
    add_policy(engine, "sel", seed=12)
    params = engine.adapters["sel"].params
    data = ppo_data(engine, "sel", 41, n=5)
    # Only the second half of each sequence is an action (weight 1), as in a prompt + response.
    data = [
        d.model_copy(
            update={"weights": [0.0 if t < len(d.tokens) // 2 else 1.0 for t in range(len(d.tokens))]}
        )
        for d in data
    ]
    cfg = PPOConfig(entropy_coef=0.01, kl_coef=0.1)

    def run() -> tuple[float, dict[str, float], list[torch.Tensor]]:
        r = engine.forward_backward(ForwardBackwardRequest(adapter="sel", loss="ppo", data=data, ppo=cfg))
        g = [p.grad.clone() for p in params]
        engine.adapters["sel"].optimizer.zero_grad(set_to_none=True)
        return r.loss, r.stats, g

    fast = run()
    assert engine.bases["b"].plain_head  # tiny:llama takes the selective path...
    monkeypatch.setattr(engine.bases["b"], "plain_head", False)  # ...and now the full-logits one
    full = run()
    assert fast[0] == pytest.approx(full[0], rel=1e-5, abs=1e-7)
    for k in ("entropy", "kl_ref", "approx_kl", "clipfrac"):
        assert fast[1][k] == pytest.approx(full[1][k], rel=1e-4, abs=1e-7), k
    for a, b in zip(fast[2], full[2], strict=True):
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())
    assert sum(float(g.abs().sum()) for g in fast[2]) > 0
    engine.delete_adapter("sel")


def test_bf16_on_cpu_samples_and_trains() -> None:
    """dtype=bfloat16 on CPU: every pass runs under bf16 autocast (decode attention in fp32), LoRA
    weights stay fp32; sampling and forward agree to bf16 precision; training moves it."""
    eng = Engine(device="cpu")
    try:
        info = eng.create_base(BaseCreate(name="h", source="tiny:llama", seed=0, dtype="bfloat16"))
        assert info.dtype == "bfloat16"
        hf = eng.bases["h"].hf
        # on CPU: embeddings and norms fp32 (an fp32 residual stream), linear weights bf16, decode
        # attention in the cache's dtype
        assert hf.get_input_embeddings().weight.dtype == torch.float32
        assert hf.model.norm.weight.dtype == torch.float32
        assert hf.get_output_embeddings().weight.dtype == torch.bfloat16
        assert hf.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
        assert hf.config._attn_implementation == "marft_sdpa"
        add_policy(eng, "p", base="h", seed=3)
        assert all(p.dtype == torch.float32 for p in eng.adapters["p"].params)
        reqs = [
            SampleRequest(
                adapter="p", prompt_ids=s, sampling=SamplingParams(temperature=1.0, max_new_tokens=8)
            )
            for s in seqs(4, 77)
        ]
        out = eng.sample(SampleBatch(requests=reqs, seed=1))
        diffs = []
        for res in out.results:
            c = res.completions[0]
            f = eng.forward(ForwardRequest(adapter="p", data=[Datum(tokens=res.prompt_ids + c.response_ids)]))
            diffs += [
                abs(a - b)
                for a, b in zip(f.results[0].logprobs[len(res.prompt_ids) :], c.logprobs, strict=True)
            ]
        assert max(diffs) < 0.5 and sum(diffs) / len(diffs) < 0.1, diffs  # bf16: not bit-equal, but close
        before = [p.detach().clone() for p in eng.adapters["p"].params]
        data = ppo_data(eng, "p", 5, n=3)
        eng.forward_backward(ForwardBackwardRequest(adapter="p", loss="ppo", data=data))
        eng.optim_step(OptimStepRequest(adapter="p"))
        assert any(not torch.equal(a, b) for a, b in zip(before, eng.adapters["p"].params, strict=True))
    finally:
        eng.close()


def test_lora_on_some_layers_only(tmp_path: Path) -> None:
    """lora.layers: LoRA weights only in those layers (negative counts from the last); a critic there
    trains, survives a checkpoint round trip, and a bad index is a 400 naming lora.layers."""
    eng = Engine(device="cpu")
    try:
        eng.create_base(BaseCreate(name="b", source="tiny:llama", seed=0))  # 2 layers
        info = eng.create_adapter(
            AdapterCreate(
                name="top",
                base="b",
                kind="critic",
                lora=LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"], layers=[-1]),
                value_head_hidden=[8],
            )
        )
        assert info.lora.layers == [1]
        names = [n for n, p in eng.bases["b"].peft.named_parameters() if ".top." in n and "lora_" in n]
        assert names and all(".layers.1." in n for n in names), names
        data = [Datum(tokens=s, returns=[1.0] * len(s), old_values=[0.0] * len(s)) for s in seqs(3, 5)]
        before = [p.detach().clone() for p in eng.adapters["top"].params]
        eng.forward_backward(ForwardBackwardRequest(adapter="top", loss="value", data=data))
        eng.optim_step(OptimStepRequest(adapter="top"))
        after = [p.detach().clone() for p in eng.adapters["top"].params]
        assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
        eng.save_checkpoint(CheckpointRequest(path=str(tmp_path / "ck"), adapters=["top"]))
        eng.delete_adapter("top")
        eng.load_checkpoint(CheckpointRequest(path=str(tmp_path / "ck")))
        assert eng.adapters["top"].lora.layers == [1]
        assert all(torch.equal(a, b) for a, b in zip(after, eng.adapters["top"].params, strict=True))
        with pytest.raises(EngineError, match=r"lora\.layers"):
            eng.create_adapter(
                AdapterCreate(name="bad", base="b", lora=LoraConfig(target_modules=["q_proj"], layers=[2]))
            )
    finally:
        eng.close()


def test_forward_with_weights_computes_only_those_positions(engine: Engine) -> None:
    toks = seqs(3, 123, 8, 14)
    full = engine.forward(ForwardRequest(adapter="A", data=[Datum(tokens=t) for t in toks])).results
    w = [[0.0] * (len(t) // 2) + [1.0] * (len(t) - len(t) // 2) for t in toks]
    part = engine.forward(
        ForwardRequest(adapter="A", data=[Datum(tokens=t, weights=x) for t, x in zip(toks, w, strict=True)])
    ).results
    for f, p, x in zip(full, part, w, strict=True):
        assert f.logprobs is not None and p.logprobs is not None
        for a, b, wt in zip(f.logprobs, p.logprobs, x, strict=True):
            assert (b == pytest.approx(a, abs=1e-5)) if wt > 0 else b == 0.0
