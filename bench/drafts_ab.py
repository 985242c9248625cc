"""Speculative decoding with prompt-lookup drafts (`draft_tokens`) against none, in one process: one
engine, calls of the two settings alternated, at each batch size. The prompts are a team's last
agent's: a math problem and three earlier agents' worked answers to restate, as the 4-agent rollout
of bench/rollout.ts ends (its summarizer). Temperature 0.5, top-k 50 as there. The two settings draw
different tokens (each from the same distribution), so the figure is sampled tokens per second.

    .venv/bin/python bench/drafts_ab.py [--reps 7] [--batches 1,4,16] [--draft 8] [--dtypes auto]
        [--source pkg:smollm2-135m-instruct] [--out F.json]

Figures per batch B: `b{B}_speedup` (the median of the paired ratios of tokens per second, drafts
over none), `b{B}_tokens_per_s_{none,drafts}` (medians), `b{B}_acceptance` (accepted over drafted
tokens) and `b{B}_tokens_per_step` (with drafts: a row's tokens per decode step, the first token of
each row, which its prefill chooses, left out). Threads: torch's choice, as `marft` runs the engine.
"""

from __future__ import annotations

import statistics
import time

from marft_engine.engine import Engine
from marft_engine.schemas import BaseCreate, SampleBatch, SampleRequest, SamplingParams
from probe import ab_arguments, paired_speedup, problems, prompts_of, write_figures
from speed_bench import SMOL

SYSTEM = "You are the summarizer of a team solving math word problems. Be brief."


def team_prompts(tok: object, n: int) -> list[list[int]]:
    """n prompts: a problem, then the reasoner's, actor's and verifier's answers to it."""
    users = []
    for i, p in enumerate(problems(n, 7)):
        a, b = (int(w) for w in p.split() if w.isdigit())
        work = f"We start with {a}. Getting {b} more gives {a} + {b} = {a + b}. The answer is {a + b}."
        check = f"{a} + {b} = {a + b} is right, so the answer is {a + b}."
        users.append(
            f"{p}\n\nreasoner: {work}\nactor: {work}\nverifier: {check} (case {i})"
        )
    return prompts_of(tok, SYSTEM, users)


def compare(eng: Engine, batch: int, draft: int, reps: int) -> dict[str, float]:
    ps = team_prompts(eng.bases["s"].tokenizer, batch)

    def call(k: int, seed: int) -> tuple[float, int, int, int, int]:
        """(seconds, tokens, rows over its decode steps, drafted, accepted) of one call."""
        sp = SamplingParams(
            temperature=0.5, top_k=50, max_new_tokens=64, draft_tokens=k
        )
        reqs = [
            SampleRequest(
                adapter="__base__", base="s", prompt_ids=p, sampling=sp, seed=seed + i
            )
            for i, p in enumerate(ps)
        ]
        before = eng.stats({})
        t = time.perf_counter()
        out = eng.sample(SampleBatch(requests=reqs))
        dt = time.perf_counter() - t
        after = eng.stats({})
        return (
            dt,
            out.tokens_sampled,
            after.decode_rows - before.decode_rows,
            after.drafted_tokens - before.drafted_tokens,
            after.accepted_drafts - before.accepted_drafts,
        )

    none: list[float] = []
    drafts: list[float] = []
    drafted = accepted = tokens = steps = 0
    for rep in range(reps + 1):  # the first round warms up
        a = call(0, 1000 * rep)
        b = call(draft, 1000 * rep)
        if rep:
            none.append(a[1] / a[0])
            drafts.append(b[1] / b[0])
            tokens, steps = tokens + b[1] - batch, steps + b[2]
            drafted, accepted = drafted + b[3], accepted + b[4]
        print(
            f"batch {batch} round {rep}: none {a[1] / a[0]:.1f} tokens/s, drafts {b[1] / b[0]:.1f}",
            flush=True,
        )
    return {
        "speedup": paired_speedup(drafts, none),  # rates, not times: drafts over none
        "tokens_per_s_none": statistics.median(none),
        "tokens_per_s_drafts": statistics.median(drafts),
        "acceptance": accepted / max(1, drafted),
        "tokens_per_step": tokens / max(1, steps),
    }


def main() -> None:
    ap = ab_arguments(__doc__ or "", SMOL)
    ap.set_defaults(dtypes="auto")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--draft", type=int, default=8)
    args = ap.parse_args()
    res: dict[str, float] = {}
    for dtype in args.dtypes.split(","):
        eng = Engine(device="cpu", max_batch=64)
        try:
            eng.create_base(BaseCreate(name="s", source=args.source, dtype=dtype))  # type: ignore[arg-type]
            for batch in (int(b) for b in args.batches.split(",")):
                part = compare(eng, batch, args.draft, args.reps)
                res |= {f"{dtype}_b{batch}_{k}": v for k, v in part.items()}
        finally:
            eng.close()
    write_figures(res, args.out)


if __name__ == "__main__":
    main()
