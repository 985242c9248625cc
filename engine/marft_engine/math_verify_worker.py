"""A long-lived Math-Verify worker: JSONL requests on stdin, one JSONL verdict per request on stdout.

Started by the TypeScript pool (src/envs/math/math-verify-pool.ts), which enforces the time limit
of each answer by killing and restarting a worker that does not answer in time. Math-Verify's own
signal-based timeouts stay on as a second, in-process guard (this is the process's main thread).

Request:  {"id": 7, "gold": "...", "pred": "...", "raw": false, "precision": 6, "strict": true,
           "allow_set_relation_comp": false, "match_types": ["latex", "expr"]}
          raw=false: gold and pred are answers already extracted (wrapped in \\boxed{} to parse);
          raw=true: both are free text, parsed as Math-Verify's own tests parse them (the bench);
          pred_raw=true: pred alone is free text (a whole response), gold an extracted answer.
Response: {"id": 7, "equal": true}  or  {"id": 7, "equal": false, "error": "..."}
The first line written is {"ready": true, "version": "..."} once Math-Verify has been imported.

Nothing here is imported by the engine server: it is a separate process with its own dependencies.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> None:
    try:
        from importlib.metadata import version

        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError as e:  # the pool reads this and falls back to the TypeScript checker
        sys.stdout.write(json.dumps({"ready": False, "error": f"math-verify not installed: {e}"}) + "\n")
        sys.stdout.flush()
        return

    def targets(kinds: list[str]) -> list[Any]:
        out: list[Any] = []
        for k in kinds:
            if k == "latex":
                out.append(LatexExtractionConfig(boxed_match_priority=0))
            elif k == "expr":
                out.append(ExprExtractionConfig())
            else:
                raise ValueError(f"unknown match type {k!r}")
        return out

    def judge(req: dict[str, Any]) -> bool:
        gold, pred = str(req["gold"]), str(req["pred"])
        raw = bool(req.get("raw", False))
        if not raw:
            gold = f"\\boxed{{{gold}}}"
        if not raw and not req.get("pred_raw", False):
            pred = f"\\boxed{{{pred}}}"
        kinds = targets(list(req.get("match_types", ["latex", "expr"])))
        return bool(
            verify(
                parse(gold, kinds),
                parse(pred, kinds),
                float_rounding=int(req.get("precision", 6)),
                strict=bool(req.get("strict", True)),
                allow_set_relation_comp=bool(req.get("allow_set_relation_comp", False)),
            )
        )

    sys.stdout.write(json.dumps({"ready": True, "version": version("math-verify")}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req_id: Any = None
        try:
            req = json.loads(line)
            req_id = req.get("id")
            out: dict[str, Any] = {"id": req_id, "equal": judge(req)}
        except Exception as e:  # one bad answer must not end the worker
            out = {"id": req_id, "equal": False, "error": f"{type(e).__name__}: {e}"[:300]}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
