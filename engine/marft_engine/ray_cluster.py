"""Ray for replicas.py: the front's connection (join an existing cluster, `engine.ray.address`, or
start a local one that lives and dies with this process), and the replicas as actors (start them,
call several at once, tell refusals from deaths).

A local cluster is kept small and private: no dashboard, a small object store (only requests,
answers and adapter states pass through it), the node on loopback, its own temp directory (not the
/tmp/ray that other clusters on the machine share), its own auth token (not ~/.ray/auth_token,
likewise shared), and Ray's usage statistics off (they would be sent over the network).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from .errors import EngineError

log = logging.getLogger("marft_engine")

NAMESPACE = "marft"
START_TIMEOUT_S = 900.0  # a replica imports torch and builds its engine; slow on a loaded machine
PING_TIMEOUT_S = 60.0  # a replica that does not answer a ping in this time is replaced as dead
OBJECT_STORE_BYTES = 256 * 1024 * 1024
# Starting a local cluster launches half a dozen Python helpers; on a loaded machine the raylet can
# give up waiting for one of them (it allows about 15 s), which a second try usually gets past.
LOCAL_START_TRIES = 3


@dataclass
class RayConnection:
    started: bool  # we started the cluster (and stop it on close)
    temp_dir: str | None
    loopback: bool  # every node of the cluster is this machine's loopback

    def close(self) -> None:
        ray.shutdown()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def connect(address: str | None, cpus: float, gpus: float | None) -> RayConnection:
    """Join the cluster at `address`, or start a local one with `cpus` CPUs (and the GPUs Ray finds,
    or `gpus`)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is not None:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=True, configure_logging=False)
        return RayConnection(started=False, temp_dir=None, loopback=False)
    # ray.init turns token auth on for a new local cluster (unless RAY_AUTH_MODE says otherwise) and
    # takes the token from here before it would make one in ~/.ray
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_urlsafe(24)
    for attempt in range(1, LOCAL_START_TRIES + 1):
        temp_dir = tempfile.mkdtemp(prefix="marft-ray-")
        try:
            ray.init(
                num_cpus=math.ceil(cpus),
                num_gpus=None if gpus is None else math.ceil(gpus),
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                namespace=NAMESPACE,
                log_to_driver=True,
                configure_logging=False,
                _node_ip_address="127.0.0.1",
                _temp_dir=temp_dir,
            )
            return RayConnection(started=True, temp_dir=temp_dir, loopback=True)
        except Exception as e:
            ray.shutdown()
            if attempt == LOCAL_START_TRIES:
                raise RuntimeError(
                    f"could not start a local Ray cluster ({LOCAL_START_TRIES} tries); logs: {temp_dir}"
                ) from e
            log.warning("starting a local Ray cluster failed (%s); trying again", e)
            shutil.rmtree(temp_dir, ignore_errors=True)
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------------
# the replicas as actors


@dataclass(frozen=True)
class ReplicaOptions:
    replicas: int
    device: str = "auto"
    max_batch: int = 64
    cpus: float = 1.0  # Ray CPUs per replica (what the scheduler reserves)
    gpus: float | None = None  # per replica; None: 1 if the cluster has a GPU for each replica, else 0
    threads: int | None = None  # torch threads per replica; None: the CPUs, at least 1
    address: str | None = None  # an existing Ray cluster; None: start a local one
    checkpoint_root: str | None = None  # every replica's checkpoint root (None: ./runs)

    def torch_threads(self) -> int:
        return self.threads if self.threads is not None else max(1, math.floor(self.cpus))

    def gpus_per_replica(self) -> float:
        if self.gpus is not None:
            return self.gpus
        if self.device == "cpu":
            return 0.0
        return 1.0 if ray.cluster_resources().get("GPU", 0.0) >= self.replicas else 0.0


class ReplicaActor:
    """The Ray actor: it builds its Replica (replica.py, which imports torch) in the worker process, so
    the front that defines it imports no torch. `call` runs one of the Replica's methods."""

    def __init__(self, index: int, device: str, max_batch: int, threads: int, root: str | None) -> None:
        from .replica import Replica

        self.replica = Replica(index, device, max_batch, threads, root)

    async def call(self, method: str, *args: Any) -> Any:
        return await getattr(self.replica, method)(*args)


@dataclass
class Slot:
    """One replica's place in the group; its actor changes when it is replaced."""

    index: int
    handle: Any = None
    pid: int = 0
    node: str = ""
    device: str = ""
    restarts: int = 0
    up: bool = False  # routable: alive and holding the group's state
    rows: int = 0  # sample rows in flight
    sample_calls: int = 0

    def call(self, method: str, *args: Any) -> Any:
        """Run the replica's `method` (an ObjectRef of its answer)."""
        return self.handle.call.remote(method, *args)


def start(slots: list[Slot], options: ReplicaOptions, conn: RayConnection) -> None:
    """Start an actor in each slot (in parallel) and wait until each has built its Engine."""
    threads = options.torch_threads()
    env = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    if conn.loopback:  # gloo's connections on loopback too
        env["GLOO_SOCKET_IFNAME"] = "lo0" if sys.platform == "darwin" else "lo"
    actor = ray.remote(ReplicaActor).options(
        num_cpus=options.cpus,
        num_gpus=options.gpus_per_replica(),
        max_restarts=0,  # the front replaces a dead replica itself, with the group's state
        max_task_retries=0,
        runtime_env={"env_vars": env},
    )
    for s in slots:
        s.handle = actor.remote(s.index, options.device, options.max_batch, threads, options.checkpoint_root)
    infos = ray.get([s.call("info") for s in slots], timeout=START_TIMEOUT_S)
    for s, info in zip(slots, infos, strict=True):
        s.pid, s.node, s.device = info["pid"], info["node"], info["device"]
        log.info(
            "replica %d: pid %d on %s, %s, %d threads", s.index, s.pid, s.node, s.device, info["threads"]
        )


def kill(slot: Slot) -> None:
    try:
        ray.kill(slot.handle, no_restart=True)
    except Exception:  # already gone
        pass


def dead(slots: list[Slot]) -> list[Slot]:
    """The slots whose replica is dead (or does not answer a ping within PING_TIMEOUT_S)."""
    refs = [(s, s.call("ping")) for s in slots]
    out = []
    for s, ref in refs:
        try:
            ray.get(ref, timeout=PING_TIMEOUT_S)
        except (RayActorError, GetTimeoutError):
            out.append(s)
    return out


@dataclass
class Outcomes:
    """The answers of one call sent to several replicas: per replica, its value or its exception."""

    values: list[Any] = field(default_factory=list)

    def refusals(self) -> list[tuple[int, EngineError]]:
        return [(i, v) for i, v in enumerate(self.values) if isinstance(v, EngineError)]

    def failures(self) -> list[BaseException]:
        return [v for v in self.values if isinstance(v, BaseException) and not isinstance(v, EngineError)]


def gather(refs: list[Any]) -> Outcomes:
    out = Outcomes()
    for ref in refs:
        try:
            out.values.append(ray.get(ref))
        except Exception as e:  # a refusal or a failure: the caller judges
            out.values.append(e)
    return out


def is_actor_death(e: BaseException) -> bool:
    return isinstance(e, RayActorError)
