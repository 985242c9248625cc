"""Several engine replicas behind one front (`engine.replicas: N`): `ReplicaGroup` has the Engine's
methods, so server.py serves it unchanged and the HTTP protocol is the same.

Each replica is a Ray actor (replica.py) holding every base and adapter. The front
- makes every change of state (bases, adapters, optimizer steps, checkpoint loads) on all replicas,
  one change at a time (`lock`), each with a sequence number;
- routes each sample call to the replica with the fewest rows in flight. A call of several
  requests that each carry a seed (the lock-step rollout's one call per round) is cut into one part
  of consecutive requests per replica, so a round samples on all of them; a request's tokens depend
  on its seed alone, so not on the part. A call's seeds travel with it and one without a batch seed
  gets one drawn from replica 0's RNG (as one engine draws it from its own, saved in checkpoints),
  so its tokens do not depend on the replica;
- cuts forward and forward_backward calls by data into one shard per replica (shards.py). A
  forward_backward shard runs with the whole call's normalisers, optim_step sums the gradients over
  the replicas (torch.distributed: gloo on CPU, nccl on GPU) before clipping, and every replica
  applies the same update: adapters, versions and optimizer states stay identical;
- writes checkpoints from replica 0; every replica loads them.

Faults. A replica that died (noticed by a call that fails, or by the watcher within WATCH_SECONDS)
is replaced by a new actor, which gets the state of the most recent survivor; the survivors and it
drop their accumulated gradients, and the front replays the forward_backward calls since the last
optimizer steps (it keeps them: `pending`), then retries the call that failed. A change that a
survivor had already applied counts as done (its answer is returned), so nothing is applied twice;
a sample call is sent again, whole, to a live replica, with the same seeds. If every replica died,
the front stops (`on_lost`): the trainer restarts a dead engine from its last checkpoint.

Roles: today every replica samples and trains. `_samplers()` and `_trainers()` are where rollout and
training can later go to different replicas.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from . import ray_cluster, shards
from .errors import BadRequest, Conflict, EngineError, NotFound, Unavailable
from .ray_cluster import Outcomes, ReplicaOptions, Slot, gather
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
    ReplicaStats,
    RetokenizeRequest,
    RetokenizeResponse,
    SampleBatch,
    SampleResponse,
    Stats,
)

__all__ = ["ReplicaGroup", "ReplicaOptions"]

log = logging.getLogger("marft_engine")

WATCH_SECONDS = 5.0  # how often the watcher pings the replicas
MAX_REBUILDS = 10  # deaths in a row while repairing, before the front gives up
MAX_RESAMPLES = 5  # times one sample call is sent again after its replica failed
REFUSALS = (BadRequest, NotFound, Conflict, Unavailable)


class _Lost(Exception):
    """A replica died during a call."""


def _refusal(e: EngineError, offset: int = 0) -> EngineError:
    """The refusal as the Engine raised it (not Ray's wrapper of it), its data indices made the whole
    call's for a shard that starts at `offset`."""
    kind = next(k for k in type(e).__mro__ if k in REFUSALS)
    return kind(shards.whole_call_message(e.message, offset))


class ReplicaGroup:
    def __init__(self, options: ReplicaOptions, on_lost: Callable[[], None] | None = None) -> None:
        self.options = options
        self.on_lost = on_lost
        self.conn = ray_cluster.connect(options.address, options.replicas * options.cpus, options.gpus)
        self.lock = threading.RLock()  # one change of state (or repair) at a time
        self.route_lock = threading.Lock()  # slots' up / rows
        self.seq = 0  # sequence number of the last change
        self.pending: list[ForwardBackwardRequest] = []  # forward_backward calls since their optimizer step
        self.lost = False
        self.closed = threading.Event()
        self.slots = [Slot(i) for i in range(options.replicas)]
        try:
            ray_cluster.start(self.slots, options, self.conn)
            self._form_group()
        except BaseException:
            self.conn.close()
            raise
        self.device_name = self.slots[0].device
        self.checkpoint_root = Path(options.checkpoint_root or "runs").absolute()
        for s in self.slots:
            s.up = True
        self.watcher = threading.Thread(target=self._watch, name="marft-replica-watch", daemon=True)
        self.watcher.start()

    # ---------------------------------------------------------------------------------------------
    # roles: where a later change can split rollout and training replicas

    def _samplers(self) -> list[Slot]:
        return self.slots

    def _trainers(self) -> list[Slot]:
        return self.slots

    # ---------------------------------------------------------------------------------------------
    # replicas' lives

    def _form_group(self) -> None:
        """Every replica leaves its process group and joins a new one of all replicas."""
        address, port = self._settled(gather([self.slots[0].call("rendezvous")]))[0]
        world = len(self.slots)
        self._settled(
            gather([s.call("join_group", address, port, r, world) for r, s in enumerate(self.slots)])
        )

    def _watch(self) -> None:
        while not self.closed.wait(WATCH_SECONDS):
            try:
                if not self.lost and ray_cluster.dead(self.slots) and not self.closed.is_set():
                    self._repair_if_dead()
            except Exception:
                log.exception("replica watcher")

    def _repair_if_dead(self) -> None:
        with self.lock:
            if self.lost:
                raise Unavailable("every replica of the engine died")
            if ray_cluster.dead(self.slots):
                self._rebuild(None, None)
            with self.route_lock:  # no repair is under way (we hold the lock): all are routable
                for s in self.slots:
                    s.up = True

    def _give_up(self, why: str) -> NoReturn:
        self.lost = True
        log.error("%s; the engine stops", why)
        if self.on_lost is not None:
            self.on_lost()
        raise Unavailable(f"{why}; the engine stops")

    def _rebuild(self, seq: int | None, settle: Callable[[Any], None] | None) -> Any:
        """Replace the dead replicas and bring the group back to one state (see the module's Faults).
        Returns change `seq`'s answer if a survivor had applied it (then settled, and done), else None."""
        for _ in range(MAX_REBUILDS):
            try:
                return self._rebuild_once(seq, settle)
            except _Lost:
                log.warning("a replica died while the group was being repaired; repairing again")
        self._give_up(f"replicas died {MAX_REBUILDS} times in a row while the group was being repaired")

    def _rebuild_once(self, seq: int | None, settle: Callable[[Any], None] | None) -> Any:
        dead = ray_cluster.dead(self.slots)
        live = [s for s in self.slots if s not in dead]
        if not live:
            self._give_up("every replica of the engine died")
        marks = self._settled(gather([s.call("last_applied") for s in live]))
        best = max(range(len(live)), key=lambda i: marks[i][0])
        source, (source_seq, source_answer) = live[best], marks[best]
        behind = dead + [s for s, m in zip(live, marks, strict=True) if m[0] != source_seq]
        with self.route_lock:
            for s in behind:
                s.up = False
        for s in dead:
            log.warning("replica %d (pid %d) died; starting a new one", s.index, s.pid)
            ray_cluster.kill(s)
            s.restarts += 1
        if dead:
            try:
                ray_cluster.start(dead, self.options, self.conn)
            except Exception as e:  # the new replica died too, or never came up
                raise _Lost() from e
            self._form_group()
        if behind:
            state = source.call("export_state")  # passed as a reference: sent once per node
            self._settled(gather([s.call("import_state", state) for s in behind]))
        done = seq is not None and source_seq == seq
        if done and settle is not None:
            settle(source_answer)
        self._replay()
        with self.route_lock:
            for s in self.slots:
                s.up = True
        log.info("replicas %s restored from replica %d", [s.index for s in behind], source.index)
        return source_answer if done else None

    def _replay(self) -> None:
        """Drop every replica's accumulated gradients and recompute those of the pending calls."""
        self._settled(gather([s.call("zero_grads") for s in self.slots]))
        for body in self.pending:
            self._forward_backward(body)

    # ---------------------------------------------------------------------------------------------
    # calls to several replicas

    def _lost_or_raise(self, out: Outcomes) -> None:
        """A failure that is not a refusal: _Lost if a replica is dead (a survivor's collective
        fails when a peer dies), else the failure itself (an internal error)."""
        failures = out.failures()
        if failures:
            if ray_cluster.dead(self.slots):
                raise _Lost()
            raise failures[0]

    def _settled(self, out: Outcomes) -> list[Any]:
        """The values, or the first refusal (replicas hold one state, so they refuse alike)."""
        self._lost_or_raise(out)
        refusals = out.refusals()
        if refusals:
            raise _refusal(refusals[0][1])
        return out.values

    def _live(self) -> None:
        if self.lost:
            raise Unavailable("every replica of the engine died")

    def _change(self, method: str, arg: Any, settle: Callable[[Any], None] | None = None) -> Any:
        """Apply one change of state on every replica."""
        self._live()
        with self.lock:
            self.seq += 1
            seq = self.seq
            for _ in range(MAX_REBUILDS):
                try:
                    answer = self._settled(gather([s.call(method, seq, arg) for s in self.slots]))[0]
                except _Lost:
                    done = self._rebuild(seq, settle)
                    if done is not None:
                        return done
                    continue
                if settle is not None:
                    settle(answer)
                return answer
            self._give_up(f"replicas died {MAX_REBUILDS} times during one {method}")

    def _on_first(self, method: str, *args: Any) -> Any:
        """A call that one replica answers for all (they hold the same state)."""
        self._live()
        while True:
            try:
                return self._settled(gather([self.slots[0].call(method, *args)]))[0]
            except _Lost:
                self._repair_if_dead()

    def _drop_pending(self, adapters: set[str]) -> None:
        self.pending = [b for b in self.pending if b.adapter not in adapters]

    # ---------------------------------------------------------------------------------------------
    # the Engine's methods

    def create_base(self, body: BaseCreate) -> BaseInfo:
        return self._change("create_base", body)

    def list_bases(self) -> BaseList:
        return self._on_first("list_bases")

    def create_adapter(self, body: AdapterCreate) -> AdapterInfo:
        return self._change("create_adapter", body)

    def list_adapters(self) -> AdapterList:
        return self._on_first("list_adapters")

    def delete_adapter(self, name: str) -> AdapterInfo:
        return self._change("delete_adapter", name, lambda _: self._drop_pending({name}))

    def sample(self, body: SampleBatch) -> SampleResponse:
        return self.submit_sample(body).result()

    def submit_sample(self, body: SampleBatch) -> concurrent.futures.Future[SampleResponse]:
        self._live()
        if body.seed is None:
            body = body.model_copy(update={"seed": self._on_first("draw_seed")})
        runs = shards.split_sample(body, len(self._samplers()))
        parts: list[concurrent.futures.Future[SampleResponse]] = []
        for r in runs:
            part: concurrent.futures.Future[SampleResponse] = concurrent.futures.Future()
            self._dispatch(body if len(runs) == 1 else shards.sample_part(body, r), part, offset=r.start)
            parts.append(part)
        return parts[0] if len(parts) == 1 else shards.joined_sample(parts)

    def _dispatch(
        self,
        body: SampleBatch,
        out: concurrent.futures.Future[SampleResponse],
        tries: int = 0,
        offset: int = 0,
    ) -> None:
        """Send a sample call (or a part of one, its first request the call's `offset`) to the
        replica with the fewest rows in flight."""
        rows = sum(r.sampling.n for r in body.requests)
        while True:
            with self.route_lock:
                up = [s for s in self._samplers() if s.up]
                if up:
                    # fewest rows in flight; ties to the one that served fewer calls (round robin)
                    slot = min(up, key=lambda s: (s.rows, s.sample_calls))
                    slot.rows += rows
                    slot.sample_calls += 1
                    break
            self._repair_if_dead()
        ref = slot.call("sample", body)

        def done(f: concurrent.futures.Future[SampleResponse]) -> None:
            with self.route_lock:
                slot.rows -= rows
            e = f.exception()
            if e is None:
                out.set_result(f.result())
            elif isinstance(e, EngineError):
                out.set_exception(_refusal(e, offset))
            else:
                if ray_cluster.is_actor_death(e):
                    with self.route_lock:
                        slot.up = False
                # not on Ray's callback thread: repairing waits for calls to other replicas
                resample = (body, out, e, tries, offset)
                threading.Thread(target=self._resample, args=resample, daemon=True).start()

        ref.future().add_done_callback(done)

    def _resample(
        self,
        body: SampleBatch,
        out: concurrent.futures.Future[SampleResponse],
        failure: BaseException,
        tries: int,
        offset: int,
    ) -> None:
        try:
            if tries >= MAX_RESAMPLES or (
                not ray_cluster.is_actor_death(failure) and not ray_cluster.dead(self.slots)
            ):
                raise failure
            self._repair_if_dead()
            self._dispatch(body, out, tries + 1, offset)
        except BaseException as e:
            out.set_exception(e)

    def forward(self, body: ForwardRequest) -> ForwardResponse:
        self._live()
        while True:
            try:
                with self.route_lock:
                    slots = [s for s in self._trainers() if s.up]
                runs = shards.split(body.data, len(slots))
                refs = [
                    s.call("forward", body.model_copy(update={"data": body.data[r.start : r.stop]}))
                    for s, r in zip(slots, runs, strict=False)
                ]
                out = gather(refs)
                self._lost_or_raise(out)
                refusals = out.refusals()
                if refusals:
                    i, e = refusals[0]
                    raise _refusal(e, runs[i].start)
                return shards.merge_forward(out.values)
            except _Lost:
                self._repair_if_dead()

    def forward_backward(self, body: ForwardBackwardRequest) -> ForwardBackwardResponse:
        self._live()
        with self.lock:
            for _ in range(MAX_REBUILDS):
                try:
                    answer = self._forward_backward(body)
                except _Lost:
                    self._rebuild(None, None)
                    continue
                self.pending.append(body)
                return answer
            self._give_up(f"replicas died {MAX_REBUILDS} times during one forward_backward")

    def _forward_backward(self, body: ForwardBackwardRequest) -> ForwardBackwardResponse:
        slots = self._trainers()
        totals = shards.call_totals(body.data)
        runs = shards.split(body.data, len(slots))
        out = gather(
            [
                s.call("forward_backward", shards.shard_request(body, r), totals)
                for s, r in zip(slots, runs, strict=False)
            ]
        )
        self._lost_or_raise(out)
        refusals = out.refusals()
        if refusals:
            if len(refusals) < len(runs):
                self._replay()  # the accepted shards' gradients go: a refused call changes nothing
            i, e = refusals[0]
            raise _refusal(e, runs[i].start)
        return shards.merge_forward_backward(body.loss, out.values)

    def forward_backward_batch(self, body: ForwardBackwardBatch) -> ForwardBackwardBatchResponse:
        """Each call as its own data-parallel forward_backward: the shared passes of one engine are a
        speed-up of the same gradients (within rounding), and each call is sharded here instead."""
        results = [self.forward_backward(call) for call in body.calls]
        return ForwardBackwardBatchResponse(results=results, fused_passes=0)

    def retokenize(self, body: RetokenizeRequest) -> RetokenizeResponse:
        return self._on_first("retokenize", body)

    def progress(self) -> Progress:
        """The replicas' compute threads together: a long call makes progress while any moves."""
        with self.route_lock:
            slots = [s for s in self.slots if s.up]
        beats, cpu = 0, 0.0
        for p in gather([s.call("progress") for s in slots]).values:
            if isinstance(p, Progress):
                beats, cpu = beats + p.beats, cpu + p.compute_cpu_seconds
        return Progress(beats=beats, compute_cpu_seconds=cpu)

    def optim_step(self, body: OptimStepRequest) -> OptimStepResponse:
        return self._change("optim_step", body, lambda _: self._drop_pending({body.adapter}))

    def save_checkpoint(self, body: CheckpointRequest) -> CheckpointResponse:
        with self.lock:  # not between a change's replicas
            return self._on_first("save_checkpoint", body)

    def load_checkpoint(self, body: CheckpointRequest) -> CheckpointResponse:
        # load drops the loaded adapters' gradients, so their pending calls are done with
        return self._change("load_checkpoint", body, lambda answer: self._drop_pending(set(answer.adapters)))

    def stats(self, endpoints: dict[str, tuple[int, float]]) -> Stats:
        self._live()
        while True:
            try:
                per = self._settled(gather([s.call("stats") for s in self.slots]))
                break
            except _Lost:
                self._repair_if_dead()
        cuda = [p.cuda_allocated_bytes for p in per if p.cuda_allocated_bytes is not None]
        cuda_max = [p.cuda_max_allocated_bytes for p in per if p.cuda_max_allocated_bytes is not None]
        return Stats(
            device=self.device_name,
            rss_bytes=sum(p.rss_bytes for p in per),
            cuda_allocated_bytes=sum(cuda) if cuda else None,
            cuda_max_allocated_bytes=sum(cuda_max) if cuda_max else None,
            tokens_sampled=sum(p.tokens_sampled for p in per),
            tokens_trained=sum(p.tokens_trained for p in per),
            decode_steps=sum(p.decode_steps for p in per),
            decode_rows=sum(p.decode_rows for p in per),
            prefill_seconds=sum(p.prefill_seconds for p in per),
            decode_seconds=sum(p.decode_seconds for p in per),
            drafted_tokens=sum(p.drafted_tokens for p in per),
            accepted_drafts=sum(p.accepted_drafts for p in per),
            endpoints={k: EndpointStats(calls=c, seconds=t) for k, (c, t) in sorted(endpoints.items())},
            replicas=[
                ReplicaStats(
                    index=s.index,
                    pid=s.pid,
                    node=s.node,
                    restarts=s.restarts,
                    rss_bytes=p.rss_bytes,
                    tokens_sampled=p.tokens_sampled,
                    tokens_trained=p.tokens_trained,
                    decode_steps=p.decode_steps,
                    decode_rows=p.decode_rows,
                    prefill_seconds=p.prefill_seconds,
                    decode_seconds=p.decode_seconds,
                    sample_calls=s.sample_calls,
                )
                for s, p in zip(self.slots, per, strict=True)
            ],
        )

    def close(self) -> None:
        self.closed.set()
        for s in self.slots:
            ray_cluster.kill(s)
        self.conn.close()
