"""The MARFT reference implementation's rollout scheme, as the baseline of `marft bench`.

The reference keeps a full model copy per agent and, within a step, lets the agents act one after
another: agent i calls Hugging Face `generate` on the batch of all episodes' observations, padded to
the longest prompt, and sampling runs until the longest response in the batch is done. Agent i+1
waits for that whole batch. This script does exactly that on the same model, prompts, sampling
settings and token limits as MARFT's rollout in bench/rollout.ts, and reports the wall time of the
rollout (model loading excluded on both sides).

Input (JSON file): {"agents": [{"role", "system_prompt"}], "graph": "sequential" | "parallel",
"problems": [str], "max_new_tokens", "temperature", "top_k", "seed", "model_dir", "dtype":
"float32" | "bfloat16"}.
Output (JSON on stdout): {"seconds", "episodes", "response_tokens", "tokens_per_s", "decode_steps"}:
decode_steps counts `generate`'s steps, each over the whole batch of episodes (padded to the longest).
"""

from __future__ import annotations

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def observation(
    system: str, problem: str, parents: list[tuple[str, str]]
) -> list[dict[str, str]]:
    # Same text as MARFT's TeamEpisode.observe: task, then "<role>: <action>" of each parent.
    user = problem
    if parents:
        user += "\n\n" + "\n".join(f"{role}: {text}" for role, text in parents)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.manual_seed(spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    tok.padding_side = "left"
    agents = spec["agents"]
    # The reference's layout: one full copy of the model per agent.
    models = [
        AutoModelForCausalLM.from_pretrained(
            spec["model_dir"], dtype=getattr(torch, spec["dtype"])
        ).eval()
        for _ in agents
    ]
    problems: list[str] = spec["problems"]
    actions: list[list[tuple[str, str]]] = [[] for _ in problems]
    tokens = 0
    # Warm-up, as MARFT's side does, not timed: one short generate per model on the first problem.
    for agent, model in zip(agents, models, strict=True):
        text = tok.apply_chat_template(
            observation(agent["system_prompt"], problems[0], []),
            add_generation_prompt=True,
            tokenize=False,
        )
        with torch.no_grad():
            model.generate(
                **tok([text], return_tensors="pt", add_special_tokens=False),
                max_new_tokens=4,
            )
    start = time.perf_counter()
    steps = 0
    for agent, model in zip(agents, models, strict=True):
        chats = [
            observation(
                agent["system_prompt"],
                p,
                actions[e] if spec["graph"] == "sequential" else [],
            )
            for e, p in enumerate(problems)
        ]
        texts = [
            tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in chats
        ]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=spec["max_new_tokens"],
                do_sample=True,
                temperature=spec["temperature"],
                top_p=1.0,
                top_k=spec["top_k"],
                pad_token_id=tok.pad_token_id,
            )
        resp = out[:, enc["input_ids"].shape[1] :]
        steps += resp.shape[1]
        for e in range(len(problems)):
            ids = resp[e].tolist()
            # Count tokens up to and including the first eos, as MARFT's engine does.
            n = next(
                (i + 1 for i, t in enumerate(ids) if t == tok.eos_token_id), len(ids)
            )
            tokens += n
            actions[e].append(
                (agent["role"], tok.decode(ids[:n], skip_special_tokens=True))
            )
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "seconds": seconds,
                "episodes": len(problems),
                "response_tokens": tokens,
                "tokens_per_s": tokens / seconds,
                "decode_steps": steps,
            }
        )
    )


if __name__ == "__main__":
    main()
