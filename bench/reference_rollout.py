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
Output (JSON on stdout): {"seconds", "episodes", "response_tokens", "tokens_per_s", "decode_steps",
"prompt_tokens", "prefill_tokens", "flops", "flops_unpadded"}: decode_steps counts `generate`'s steps,
each over the whole batch of episodes (padded to the longest); prefill_tokens the positions its
prefills computed (padding included), prompt_tokens the real ones. flops is the model FLOPs of this
scheme; flops_unpadded those of a sampler on the same draw that pads nothing, stops each answer at its
own end and prefills each agent's shared prompt prefix once (in whole cache blocks, as MARFT's prefix
cache does). Their ratio bounds what such a sampler gains where time is FLOPs (a compute-bound CPU).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
from marft_engine.prefix_cache import BLOCK
from probe import attention_flops, shape
from transformers import AutoModelForCausalLM, AutoTokenizer


def observation(
    system: str, problem: str, parents: list[tuple[str, str]]
) -> list[dict[str, str]]:
    # Same text as MARFT's TeamEpisode.observe: task, then "<role>: <action>" of each parent.
    user = problem
    if parents:
        user += "\n\n" + "\n".join(f"{role}: {text}" for role, text in parents)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def shared_prefix(prompts: list[list[int]]) -> int:
    """Tokens all prompts start with, in whole cache blocks, leaving each its last token to prefill."""
    n = min(len(p) for p in prompts) - 1
    for i in range(n):
        if any(p[i] != prompts[0][i] for p in prompts):
            n = i
            break
    return n // BLOCK * BLOCK


def call_flops(
    s: dict[str, float], prompts: list[int], answers: list[int], shared: int
) -> tuple[float, float]:
    """Model FLOPs of one agent's `generate` call over the batch, and of an unpadded sampler on the
    same rows. prompts, answers: each row's token counts; shared: prefix tokens all prompts share.
    A prefill computes the head at the last position only; the first answer token comes from it."""
    B, L, T = len(prompts), max(prompts), max(answers)
    # a decoded token's trunk and head, attention apart
    step = 2 * (s["linear"] + s["head"])
    padded = B * L * (2 * s["linear"] + attention_flops(s, L / 2)) + B * 2 * s["head"]
    padded += sum(B * (step + attention_flops(s, L + t)) for t in range(1, T))
    unpadded = sum(
        (n - shared) * (2 * s["linear"] + attention_flops(s, n / 2)) for n in prompts
    ) + shared * (2 * s["linear"] + attention_flops(s, shared / 2))
    unpadded += B * 2 * s["head"]
    unpadded += sum(
        step + attention_flops(s, n + t)
        for n, a in zip(prompts, answers, strict=True)
        for t in range(1, a)
    )
    return padded, unpadded


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
    dims = shape(models[0])
    start = time.perf_counter()
    steps = 0
    calls: list[
        tuple[Any, list[int]]
    ] = []  # per agent: its batch, its answers' lengths
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
        answers = []
        calls.append((enc, answers))
        for e in range(len(problems)):
            ids = resp[e].tolist()
            # Count tokens up to and including the first eos, as MARFT's engine does.
            n = next(
                (i + 1 for i, t in enumerate(ids) if t == tok.eos_token_id), len(ids)
            )
            tokens += n
            answers.append(n)
            actions[e].append(
                (agent["role"], tok.decode(ids[:n], skip_special_tokens=True))
            )
    seconds = time.perf_counter() - start
    prompt_tokens = prefill_tokens = 0
    flops = flops_unpadded = 0.0
    for enc, answers in calls:
        ids = [
            i[m == 1].tolist()
            for i, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)
        ]
        prompt_tokens += sum(len(i) for i in ids)
        prefill_tokens += enc["input_ids"].numel()
        f, u = call_flops(dims, [len(i) for i in ids], answers, shared_prefix(ids))
        flops += f
        flops_unpadded += u
    print(
        json.dumps(
            {
                "seconds": seconds,
                "episodes": len(problems),
                "response_tokens": tokens,
                "tokens_per_s": tokens / seconds,
                "decode_steps": steps,
                "prompt_tokens": prompt_tokens,
                "prefill_tokens": prefill_tokens,
                "flops": flops,
                "flops_unpadded": flops_unpadded,
            }
        )
    )


if __name__ == "__main__":
    main()
