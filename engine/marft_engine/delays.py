"""Test-only delays: make chosen engine calls slow, or stall, on purpose.

MARFT_ENGINE_TEST_DELAY="name=SECONDS[:stall],..." where name is an engine method (sample,
forward, forward_backward, optim_step, save_checkpoint, load_checkpoint, create_base, ...) or
sample_greedy (a sample call whose requests are all greedy: evaluation's). Before each such call the
compute thread either works for SECONDS (a busy loop: what a slow CPU looks like, the thread's CPU
time moves) or, with `:stall`, sleeps for them (what a stuck engine looks like: no step finishes and
no CPU time moves). Each delay is logged ("test delay: <name> ..."), so a test can see when one
starts. The tests of the client's liveness watch and of kill -9 at chosen moments use it; nothing
else should.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

log = logging.getLogger("marft_engine")
ENV = "MARFT_ENGINE_TEST_DELAY"


@dataclass(frozen=True)
class Delay:
    seconds: float
    stall: bool


def parse(spec: str) -> dict[str, Delay]:
    out: dict[str, Delay] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, _, value = item.partition("=")
        seconds, _, mode = value.partition(":")
        try:
            out[name.strip()] = Delay(float(seconds), mode.strip() == "stall")
        except ValueError:
            raise SystemExit(f"{ENV}: expected name=SECONDS[:stall], got {item!r}") from None
        if mode.strip() not in ("", "stall"):
            raise SystemExit(f"{ENV}: expected name=SECONDS[:stall], got {item!r}")
    return out


class Delays:
    def __init__(self, table: dict[str, Delay]) -> None:
        self.table = table

    @classmethod
    def from_env(cls) -> Delays | None:
        spec = os.environ.get(ENV, "")
        if not spec:
            return None
        table = parse(spec)
        log.warning("%s is set: calls are delayed on purpose (%s)", ENV, spec)
        return cls(table)

    def before(self, name: str, args: tuple[object, ...]) -> None:
        if name == "submit_sample":
            name = "sample"
            requests = getattr(args[0], "requests", []) if args else []
            if requests and all(r.sampling.temperature == 0 for r in requests):
                name = "sample_greedy" if "sample_greedy" in self.table else name
        d = self.table.get(name)
        if d is None:
            return
        log.info("test delay: %s %s for %.1f s", name, "stalls" if d.stall else "works", d.seconds)
        if d.stall:
            time.sleep(d.seconds)
            return
        end = time.perf_counter() + d.seconds
        while time.perf_counter() < end:
            pass
