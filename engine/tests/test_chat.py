"""Prompts from messages (chat.py): one template pass, sampled ids spliced in verbatim, tools.

Token-in, token-out is tested where re-tokenizing the text would NOT give the sampled ids back: the
byte-level tiny tokenizer on invalid UTF-8 (which decodes to U+FFFD, three other bytes), and the
real SmolLM2 tokenizer on a non-canonical BPE split of a word.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from marft_engine import chat, models
from marft_engine.engine import Engine
from marft_engine.errors import BadRequest
from marft_engine.schemas import ChatMessage, SampleBatch, SampleRequest, SamplingParams

PLAIN_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {"name": "transfer_to_checker", "parameters": {"type": "object", "properties": {}}},
    }
]


def M(role: str, content: str | None, **kw: object) -> ChatMessage:  # noqa: N802
    return ChatMessage.model_validate({"role": role, "content": content, **kw})


def ids_of(
    tok: PreTrainedTokenizerBase, messages: list[ChatMessage], tools: list | None = None
) -> chat.Prompt:
    eos = [int(tok.eos_token_id)]
    return chat.prompt_ids(tok, messages, tools, eos, len(tok), base_name="b")


def plain(tok: PreTrainedTokenizerBase, messages: list[ChatMessage], tools: list | None = None) -> list[int]:
    msgs = [{"role": m.role, "content": m.content or ""} for m in messages]
    out = tok.apply_chat_template(
        msgs, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(out)


@pytest.fixture(scope="module")
def byte_tok() -> PreTrainedTokenizerBase:
    return models.byte_tokenizer()


@pytest.fixture(scope="module")
def smol_tok() -> PreTrainedTokenizerBase:
    cached = models.cache_root() / "models" / models.SMOLLM2_DIR_NAME
    if (Path(cached) / "config.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached))
    return models.load_smollm2()[1]  # converts and caches once (test_smollm2 then reuses it)


def test_tiny_template_without_tools_is_plain_chatml(byte_tok: PreTrainedTokenizerBase) -> None:
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi\n there"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": ""},
    ]
    ours = byte_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert ours == byte_tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=False, chat_template=PLAIN_CHATML
    )


def test_without_token_ids_it_is_the_template(byte_tok: PreTrainedTokenizerBase) -> None:
    msgs = [M("system", "s"), M("user", "q é"), M("assistant", "a"), M("user", "again")]
    p = ids_of(byte_tok, msgs)
    assert p.ids == plain(byte_tok, msgs) and p.retokenized == []


def _prefix_property(tok: PreTrainedTokenizerBase, sampled: list[int]) -> None:
    """Turn 1 is sampled as `sampled` (ending on eos); turn 2's prompt repeats the exchange."""
    first = [M("system", "be brief"), M("user", "say something")]
    p1 = ids_of(tok, first)
    text = tok.decode(sampled[:-1], skip_special_tokens=False)
    second = [*first, M("assistant", text, token_ids=sampled), M("user", "and now?")]
    p2 = ids_of(tok, second)
    # the new prompt is the old prompt, then exactly the sampled ids, then the template's continuation
    assert p2.ids[: len(p1.ids) + len(sampled)] == p1.ids + sampled
    assert p2.retokenized == []
    # ... which re-tokenizing the text would not have given
    retok = plain(tok, second)
    assert retok[: len(p1.ids) + len(sampled)] != p1.ids + sampled
    # the continuation is the template's, once: no doubled eos after the span
    tail = p2.ids[len(p1.ids) + len(sampled) :]
    assert (
        tok.decode(tail, skip_special_tokens=False)
        == "\n<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_splice_byte_level_invalid_utf8(byte_tok: PreTrainedTokenizerBase) -> None:
    # a lone continuation byte decodes to U+FFFD, which re-encodes as three other bytes (EF BF BD)
    invalid = [t for t in range(256) if byte_tok.decode([t]) == "\ufffd"]
    eos = byte_tok.convert_tokens_to_ids("<|im_end|>")
    sampled = [*byte_tok("hi", add_special_tokens=False)["input_ids"], invalid[0], invalid[1], eos]
    assert byte_tok(byte_tok.decode(sampled[:-1]), add_special_tokens=False)["input_ids"] != sampled[:-1]
    _prefix_property(byte_tok, sampled)


def test_splice_smollm2_non_canonical_split(smol_tok: PreTrainedTokenizerBase) -> None:
    enc = lambda s: smol_tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert enc("Hello world") == [19556, 905]  # canonical: "Hello", " world"
    sampled = [*enc("Hel"), *enc("lo"), *enc(" world"), int(smol_tok.eos_token_id)]  # "Hel" "lo" " world"
    assert enc(smol_tok.decode(sampled[:-1])) != sampled[:-1]
    _prefix_property(smol_tok, sampled)


def test_a_span_without_eos_keeps_the_templates_end(smol_tok: PreTrainedTokenizerBase) -> None:
    enc = lambda s: smol_tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    sampled = [*enc("Hel"), *enc("lo")]  # cut by max_tokens: no eos sampled
    msgs = [M("user", "q"), M("assistant", "Hello", token_ids=sampled), M("user", "r")]
    p = ids_of(smol_tok, msgs)
    i = next(k for k in range(len(p.ids)) if p.ids[k : k + 2] == sampled)
    after = smol_tok.decode(p.ids[i + 2 :], skip_special_tokens=False)
    assert after.startswith("<|im_end|>\n<|im_start|>user\nr")


def test_a_template_that_drops_content_falls_back_to_text(byte_tok: PreTrainedTokenizerBase) -> None:
    tok = models.byte_tokenizer()
    tok.chat_template = (  # drops every assistant message but the last (as reasoning templates do)
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
        "{{ '<|im_start|>assistant\n' }}"
    )
    msgs = [M("user", "q"), M("assistant", "x", token_ids=[65]), M("user", "r")]
    p = ids_of(tok, msgs)
    assert p.retokenized == [1]
    assert p.ids == plain(tok, msgs)


def test_bad_messages_name_the_field(byte_tok: PreTrainedTokenizerBase) -> None:
    with pytest.raises(BadRequest, match=r"messages\[0\]\.token_ids: only assistant"):
        ids_of(byte_tok, [M("user", "q", token_ids=[1])])
    with pytest.raises(BadRequest, match=r"messages\[1\]\.token_ids\[1\]: token id 99999"):
        ids_of(byte_tok, [M("user", "q"), M("assistant", "a", token_ids=[1, 99999])])
    with pytest.raises(BadRequest, match=r"messages\[0\]\.content: required"):
        ids_of(byte_tok, [M("user", None)])
    with pytest.raises(BadRequest, match=r"messages: empty"):
        ids_of(byte_tok, [])


def test_tools(byte_tok: PreTrainedTokenizerBase, smol_tok: PreTrainedTokenizerBase) -> None:
    assert chat.supports_tools(byte_tok) and not chat.supports_tools(smol_tok)
    call = {"type": "function", "function": {"name": "transfer_to_checker", "arguments": {}}}
    msgs = [
        M("user", "q"),
        M("assistant", None, tool_calls=[call]),
        M("tool", '{"assistant": "checker"}', tool_call_id="c1"),
    ]
    text = byte_tok.decode(ids_of(byte_tok, msgs, TOOLS).ids)
    assert '<tools>\n{"type": "function", "function": {"name": "transfer_to_checker"' in text
    assert '<tool_call>\n{"name": "transfer_to_checker", "arguments": {}}\n</tool_call><|im_end|>' in text
    assert '<tool_response>\n{"assistant": "checker"}\n</tool_response>' in text
    with pytest.raises(BadRequest, match=r"tools: the chat template of base 'b' does not render tools"):
        ids_of(smol_tok, [M("user", "q")], TOOLS)


def test_sample_splices_and_reports(engine: Engine) -> None:
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    first = [M("user", "hello")]
    r1 = engine.sample(SampleBatch(requests=[SampleRequest(adapter="A", messages=first, sampling=greedy)]))
    c = r1.results[0].completions[0]
    second = [*first, M("assistant", c.text, token_ids=c.response_ids), M("user", "more")]
    r2 = engine.sample(SampleBatch(requests=[SampleRequest(adapter="A", messages=second, sampling=greedy)]))
    p1, p2 = r1.results[0].prompt_ids, r2.results[0].prompt_ids
    assert p2[: len(p1) + len(c.response_ids)] == p1 + c.response_ids
    assert r2.results[0].retokenized == []
    assert engine.list_bases().bases[0].tools is True
