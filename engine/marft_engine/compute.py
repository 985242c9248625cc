"""The engine's compute thread: every engine call and every decode step runs on this one thread.

Why one thread: torch work on one model is not thread-safe, and on a CPU every thread that runs
torch ops gets its own OpenMP pool; with more pooled threads than cores, OpenMP stops spinning between
parallel regions and every op pays for waking its workers.

The thread runs calls (`call`, `on_compute_thread`) between the steps of its background work (the
sampler's decode loop): a call waits for one decode step at most, and sampling goes on while calls
come and go. The work's state is touched on this thread only, so it needs no lock of its own.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


class Work(Protocol):
    """Background work the compute thread steps whenever no call is waiting."""

    def busy(self) -> bool:
        """Whether there is a step to run."""
        ...

    def step(self) -> None:
        """Run one step (for the sampler: admit waiting rows, then one decode step of every batch)."""
        ...


class ComputeThread:
    def __init__(self, work: Work) -> None:
        self.work = work
        self.cond = threading.Condition()  # guards calls and stopped
        # Waiting calls; each runs its function (argument False) or fails (True: the engine is closed).
        self.calls: deque[Callable[[bool], None]] = deque()
        self.stopped = False
        # Progress, for clients that watch a long call (Health.progress): calls and work steps done.
        # Written on the compute thread only.
        self.beats = 0
        # Runs on the compute thread before each call, with the call's name and arguments (the
        # engine's test-only delays, delays.py); None: nothing.
        self.before: Callable[[str, tuple[object, ...]], None] | None = None
        self.thread = threading.Thread(target=self._loop, name="marft-compute", daemon=True)
        self.thread.start()
        assert self.thread.ident is not None
        try:
            self._cpu_clock: int | None = time.pthread_getcpuclockid(self.thread.ident)
        except (AttributeError, OSError):  # not on every platform
            self._cpu_clock = None

    def cpu_seconds(self) -> float:
        """CPU time the compute thread has used (the process's where there is no thread clock). A
        call that runs long without finishing a step still moves it, unless it is stuck: that is how
        a client tells slow from stalled."""
        if self._cpu_clock is None:
            return time.process_time()
        return time.clock_gettime(self._cpu_clock)

    def call(self, fn: Callable[[], T], name: str = "", args: tuple[object, ...] = ()) -> T:
        """Run fn on the compute thread, between steps of the work, and return its result; its
        exception reaches the caller as if it had run fn itself. On the compute thread it just runs.
        `name` and `args` are for the `before` hook."""
        if threading.current_thread() is self.thread:
            return fn()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run(closed: bool) -> None:
            if closed:
                future.set_exception(RuntimeError("the engine is closed"))
                return
            try:
                if self.before is not None:
                    self.before(name, args)
                future.set_result(fn())
            except BaseException as e:  # the caller gets it, as if it had run fn itself
                future.set_exception(e)

        with self.cond:
            if self.stopped:
                raise RuntimeError("the engine is closed")
            self.calls.append(run)
            self.cond.notify_all()
        return future.result()

    def close(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and not self.calls and not self.work.busy():
                    self.cond.wait()
                calls = list(self.calls)
                self.calls.clear()
                stopped = self.stopped
            for run in calls:  # calls first: they wait for a step at most
                run(stopped)
                self.beats += 1
            if stopped:
                return
            self.work.step()
            self.beats += 1


class OnComputeThread(Protocol):
    compute: ComputeThread


S = TypeVar("S", bound=OnComputeThread)


def on_compute_thread(method: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], T]:
    """Run a method on its object's compute thread (`self.compute`) and wait for it."""

    @functools.wraps(method)
    def run(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.compute.call(lambda: method(self, *args, **kwargs), method.__name__, args)

    return run
