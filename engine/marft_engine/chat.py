"""Prompt ids from chat messages: the base's chat template applied once, with the exact token ids of
assistant messages the engine sampled spliced in where the caller gives them (token-in, token-out).

Why splice: decoding a completion to text and tokenizing the text again need not give the sampled
ids back (a byte-level model's invalid UTF-8 decodes to U+FFFD, a BPE model may sample a
non-canonical split of a word), and a policy trained on ids it never sampled is trained on the wrong
actions. So an assistant message may carry `token_ids`, the ids it was sampled as.

How: the template is rendered once, as text, with each such message's content replaced by a unique
sentinel (its tool calls dropped: the sampled ids already hold the calls as the model wrote them).
The text is cut at the sentinels, each text piece is tokenized as `apply_chat_template` tokenizes a
whole prompt (no added special tokens), and the pieces and the sampled ids are joined in order. When
the sampled ids end with an eos token that the template writes right after the content (ChatML's
`<|im_end|>`), the piece after the span starts without that token's text, so it is not doubled.

This keeps the prefix property: a prompt that repeats an earlier prompt's messages and the reply it
got starts with that earlier prompt's ids followed by the reply's ids, because every piece before a
span is the same text, cut at the same places, as the prompt the reply was sampled from. (Templates
that render earlier turns differently from the last one, e.g. by dropping reasoning, break it in the
text itself; nothing can keep it there.)

A template that does not render a message's content verbatim exactly once (it drops, trims around or
repeats it) cannot be spliced; that message is tokenized from its text, and its index is reported
(`SampleResult.retokenized`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from .errors import BadRequest
from .schemas import ChatMessage

# Where a chat template mentions `tools` it renders tool definitions given to it (HF convention).
TOOLS_MARKER = "tools"


def supports_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the base's chat template renders tool definitions."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates, e.g. {"default": ..., "tool_use": ...}
        return "tool_use" in template or any(TOOLS_MARKER in str(t) for t in template.values())
    return isinstance(template, str) and TOOLS_MARKER in template


@dataclass
class Prompt:
    ids: list[int]
    retokenized: list[int]  # messages whose token_ids could not be spliced (tokenized from text)


def _check(messages: list[ChatMessage], vocab_size: int, where: str) -> None:
    for j, m in enumerate(messages):
        at = f"{where}messages[{j}]"
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise BadRequest(
                f"{at}.content: required (only an assistant message with tool_calls may omit it)"
            )
        if m.token_ids is None:
            continue
        if m.role != "assistant":
            raise BadRequest(f"{at}.token_ids: only assistant messages carry the ids they were sampled as")
        if not m.token_ids:
            raise BadRequest(f"{at}.token_ids: empty")
        for k, t in enumerate(m.token_ids):
            if not 0 <= t < vocab_size:
                raise BadRequest(
                    f"{at}.token_ids[{k}]: token id {t} is outside the vocabulary [0, {vocab_size})"
                )


def _as_template_dict(m: ChatMessage, content: str | None, with_tool_calls: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"role": m.role, "content": content if content is not None else ""}
    if with_tool_calls and m.tool_calls:
        d["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        d["name"] = m.name
    return d


def _render(
    tokenizer: PreTrainedTokenizerBase, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> str:
    out = tokenizer.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
    assert isinstance(out, str)
    return out


def _tokenize(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    # exactly as apply_chat_template(tokenize=True) tokenizes a rendered prompt
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]] if text else []


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    eos_ids: list[int],
    vocab_size: int,
    where: str = "",
    base_name: str = "",
) -> Prompt:
    """The prompt's ids: the chat template over `messages` (and `tools`), with the generation prompt
    at the end, and every assistant message's `token_ids` spliced in verbatim (see the module doc)."""
    if not messages:
        raise BadRequest(f"{where}messages: empty")
    _check(messages, vocab_size, where)
    if tools and not supports_tools(tokenizer):
        raise BadRequest(f"{where}tools: the chat template of base {base_name!r} does not render tools")
    nonce = secrets.token_hex(8)
    spliced = [j for j, m in enumerate(messages) if m.token_ids is not None]
    sentinel = {j: f"<<marft-span-{nonce}-{j}>>" for j in spliced}
    retokenized: list[int] = []
    try:
        while True:
            msgs = [
                _as_template_dict(m, sentinel[j], False)
                if j in sentinel
                else _as_template_dict(m, m.content, True)
                for j, m in enumerate(messages)
            ]
            text = _render(tokenizer, msgs, tools)
            bad = [j for j, s in sentinel.items() if text.count(s) != 1]
            if not bad:
                break
            for j in bad:  # rendered not exactly once: this message goes in as text
                del sentinel[j]
                retokenized.append(j)
    except (ValueError, TypeError) as e:  # e.g. a tokenizer without a chat template
        raise BadRequest(f"{where}messages: cannot apply the chat template of base {base_name!r}: {e}") from e
    except Exception as e:  # jinja2 errors (TemplateError, raise_exception in a template)
        if type(e).__module__.startswith("jinja2"):
            raise BadRequest(
                f"{where}messages: the chat template of base {base_name!r} refused them: {e}"
            ) from e
        raise

    # Cut the text at the sentinels, in the order they appear (the messages' order).
    order = sorted(sentinel, key=lambda j: text.index(sentinel[j]))
    ids: list[int] = []
    rest = text
    eos_text = {t: tokenizer.decode([t], skip_special_tokens=False) for t in eos_ids}
    for j in order:
        before, _, rest = rest.partition(sentinel[j])
        ids += _tokenize(tokenizer, before)
        span = list(messages[j].token_ids or [])
        ids += span
        end = eos_text.get(span[-1])
        if end and rest.startswith(end):
            rest = rest[len(end) :]  # the sampled eos is the token the template writes after the content
    ids += _tokenize(tokenizer, rest)
    return Prompt(ids=ids, retokenized=sorted(retokenized))
