"""Stop strings: the windowed check gives what decoding the whole output at every token gives."""

from __future__ import annotations

import random

from marft_engine.models import byte_tokenizer
from marft_engine.stops import stop_completed, text_before_stop

TOK = byte_tokenizer()  # one token per byte (a multi-byte character spans tokens) + special tokens


def decode(ids: list[int]) -> str:
    return TOK.decode(ids, skip_special_tokens=False)


def first_stop(out: list[int], stops: list[str]) -> int | None:
    """Number of tokens after which the windowed check first fires, checking after every token."""
    for n in range(1, len(out) + 1):
        if stop_completed(decode, out[:n], stops):
            return n
    return None


def first_stop_whole_text(out: list[int], stops: list[str]) -> int | None:
    """The same by decoding the whole output at every token (the check before the window)."""
    for n in range(1, len(out) + 1):
        if any(s in decode(out[:n]) for s in stops):
            return n
    return None


def test_a_stop_string_across_tokens() -> None:
    out = TOK.encode("the quick brown fox jumps over the lazy dog")
    assert first_stop(out, ["k bro"]) == len("the quick bro")
    assert first_stop(out, ["lazy", "fox"]) == len("the quick brown fox")
    assert first_stop(out, ["cat"]) is None
    assert first_stop(out, ["quick brown fox jumps"]) == len("the quick brown fox jumps")  # longer


def test_a_stop_that_the_newest_token_completes_in_earlier_text() -> None:
    # "é" is two byte tokens: after the first the text ends in a replacement character, and only the
    # second turns it, a character that began before the newest token, into the stop's last letter
    out = TOK.encode("xaé and more")
    assert decode(out[:3]).endswith("\ufffd") and "aé" not in decode(out[:3])
    assert first_stop(out, ["aé"]) == 4
    assert first_stop(out, ["é"]) == 4
    out = TOK.encode("costs 5€ now")  # "€" is three tokens
    assert first_stop(out, ["5€"]) == len("costs 5") + 3
    # a special token's text is many characters: a stop can start inside it
    out = [*TOK.encode("ok"), TOK.convert_tokens_to_ids("<|im_end|>"), *TOK.encode("x")]
    assert first_stop(out, ["end|>x"]) == 4
    assert first_stop(out, ["k<|im"]) == 3


def test_a_window_edge_makes_no_stop() -> None:
    # After "x€bbbb" (8 tokens) the window is the last 6, which start inside "€": they decode as
    # "\ufffd\ufffdbbbb", though the text holds no replacement character.
    out = TOK.encode("x€bbbb")
    assert decode(out[-6:]) == "\ufffd\ufffdbbbb"
    assert not stop_completed(decode, out, ["\ufffdb"])
    assert first_stop(out, ["\ufffdb"]) is None and first_stop_whole_text(out, ["\ufffdb"]) is None
    assert first_stop(TOK.encode("x€b"), ["€b"]) == 5  # the window [€2, €3, b] would miss it


def test_the_window_finds_what_the_whole_text_finds() -> None:
    """Random outputs of ASCII, two- to four-byte characters and special tokens, long enough that the
    window is a small part of the output, with stops cut from anywhere in their text; some end in a
    replacement character, which the text holds while a character is incomplete."""
    rng = random.Random(0)
    pieces = ["a", "b", " ", "é", "€", "😀", "ab", "<|im_end|>", "<|im_start|>"]
    for _ in range(150):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(5, 60)))
        out = TOK.encode(text)
        full = decode(out)
        stops = []
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(full))
            stops.append(full[i : i + rng.randint(1, 30)] + ("\ufffd" if rng.random() < 0.2 else ""))
        if rng.random() < 0.3:
            stops = ["zz"]  # in no output
        assert first_stop(out, stops) == first_stop_whole_text(out, stops), (text, stops)


def test_only_a_window_is_decoded_per_token() -> None:
    out = TOK.encode("abcdefgh " * 60)  # 540 tokens
    lengths: list[int] = []

    def counting(ids: list[int]) -> str:
        lengths.append(len(ids))
        return decode(ids)

    for n in range(1, len(out) + 1):
        assert not stop_completed(counting, out[:n], ["stop here"])
    assert max(lengths) <= 32, max(lengths)


def test_text_before_stop_cuts_at_the_first_stop() -> None:
    assert text_before_stop("abcXYdefZ", ["Z", "XY"]) == "abc"
    assert text_before_stop("abc", ["Z"]) == "abc"
