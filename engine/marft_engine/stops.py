"""Stop strings: whether the newest token completed one, and the text cut before it.

A row's output is checked after every token, so the check is "does the text hold a stop string now,
given that it did not one token ago". Decoding the whole output at every token costs time that grows
with the output; `stop_completed` decodes only the last tokens, as many as the newest token can have
changed the text of, and gives the same answer.
"""

from __future__ import annotations

from collections.abc import Callable

# Characters a window's text may have at its start that the whole text does not: the window's first
# token can start inside a character, which then decodes as up to 3 replacement characters.
WINDOW_EDGE = 3


def stop_completed(decode: Callable[[list[int]], str], out: list[int], stops: list[str]) -> bool:
    """Whether decode(out) contains one of `stops`, given that decode(out[:-1]) contains none.

    A stop string that is new in the text overlaps what the newest token changed: its text, which is
    at most one character longer than it decodes alone (a decoder may strip the leading space of the
    first token it decodes; a token that completes a multi-byte character turns the replacement
    character the text ended in into that character). So the stop lies within the last
    len(stop) - 1 + len(decode(out[-1:])) + 1 characters. The window is the shortest run of last
    tokens (doubling) whose text is that long plus WINDOW_EDGE, or all of `out`. A hit in a window
    is confirmed on the whole text, so the window's edge can never make a stop that is not there."""
    need = max(len(s) for s in stops) + len(decode(out[-1:])) + WINDOW_EDGE
    m = need
    window = decode(out[-m:])
    while len(window) < need and m < len(out):
        m *= 2
        window = decode(out[-m:])
    if not any(s in window for s in stops):
        return False
    if m >= len(out):  # the window was the whole text
        return True
    text = decode(out)
    return any(s in text for s in stops)


def text_before_stop(text: str, stops: list[str]) -> str:
    """The text cut before the first stop string in it (all of it when there is none)."""
    return text[: min((text.find(s) for s in stops if s in text), default=len(text))]
