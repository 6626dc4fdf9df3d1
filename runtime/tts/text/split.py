"""Long text -> pieces that each fit one Talker context (pure Python, no numpy).

A piece is a slice of the text (stripped of surrounding whitespace), so the pieces, joined, are the
text modulo whitespace: nothing is dropped. Boundaries are tried from the coarsest to the finest:

1. sentences: ``. ! ? …`` (followed by a space, a line end or the text end), CJK ``。！？｡．`` and the
   full-width ``！？`` (no space needed), or a blank line; closing quotes and brackets stay with it;
2. clauses: ``, ; :`` (followed by a space), dashes ``— –``, CJK ``，、；：`` and their full-width forms;
3. whitespace (words);
4. characters: a run without spaces (CJK, a long URL) is cut at the longest prefix that fits.

Sentences (then clauses, words) are packed greedily: a piece grows while its token count stays
within the limit, so a false sentence end ("Mr. Smith") only matters where a piece must end anyway.
Token counts come from the caller (the bundle's tokenizer), so the limit is in the Talker's own units. How large the limit may be is ``kztts.tts.tts``'s business: the prompt plus
the frames a piece is expected to need (``frames_per_token``) must fit in the context.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Callable, Iterator

_CLOSE = "\"'”’»)\\]」』】〕）"
SENTENCE = re.compile(rf"[.!?…‼⁇⁈⁉]+[{_CLOSE}]*(?=\s|$)|[。！？｡．]+[{_CLOSE}]*|\n[ \t]*\n\s*")
CLAUSE = re.compile(rf"[,;:]+[{_CLOSE}]*(?=\s|$)|[—–]+|[，、；：﹐﹑﹔﹕､]+[{_CLOSE}]*")
WORD = re.compile(r"\s+")

# Upper estimates of speech frames (12.5 per second) per text token of the Qwen tokenizer, from
# speaking rates at the slow end: English ~11 characters/s at ~4.5 characters/token is ~2.5
# tokens/s, 5 frames; Mandarin ~3 characters/s at ~1.4 characters/token is ~2.1 tokens/s, 6 frames;
# Japanese alike; Korean ~4 syllables/s at ~1.2 syllables/token is ~3.3 tokens/s, 3.8 frames, and
# takes the default 5 (digits and symbols, one token each, are read slower). Too low an estimate
# makes a piece hit the context before its end of speech, which kztts.tts.tts then reports.
FRAMES_PER_TOKEN = {"chinese": 6.0, "japanese": 6.0, "korean": 5.0}
DEFAULT_FRAMES_PER_TOKEN = 5.0
# a text still being written in no given language: its scripts are not known yet, so the largest estimate
WRITTEN_AUTO_FRAMES_PER_TOKEN = max(DEFAULT_FRAMES_PER_TOKEN, *FRAMES_PER_TOKEN.values())


_SCRIPTS = (("CJK UNIFIED", "chinese"), ("HIRAGANA", "japanese"), ("KATAKANA", "japanese"), ("HANGUL", "korean"))


def frames_per_token(language: str | None, text: str) -> float:
    """The upper estimate of frames per token for ``language`` (a manifest language name); for
    None/"auto", the largest estimate of the scripts ``text`` contains, so that a piece of a text
    never expects more per token than the whole (a piece that fits stays one piece alone)."""
    name = (language or "auto").lower()
    if name != "auto":
        return FRAMES_PER_TOKEN.get(name, DEFAULT_FRAMES_PER_TOKEN)
    rate = DEFAULT_FRAMES_PER_TOKEN
    for ch in set(text):
        if ord(ch) >= 0x3000 and ch.isalpha():
            script = unicodedata.name(ch, "")
            rate = max([rate] + [FRAMES_PER_TOKEN[lang] for prefix, lang in _SCRIPTS if script.startswith(prefix)])
    return rate


def _cuts(text: str, start: int, end: int, pattern: re.Pattern) -> list[int]:
    """Ends of the units of ``text[start:end]`` at ``pattern`` (the last one is ``end``)."""
    ends = [m.end() for m in pattern.finditer(text, start, end) if start < m.end() < end]
    return ends + [end]


def split_text(text: str, max_tokens: int, count_tokens: Callable[[str], int]) -> list[str]:
    """``text`` in pieces of at most ``max_tokens`` tokens each (``count_tokens(piece)``), cut at
    sentence, then clause, then word boundaries, then characters. A text that fits is one piece."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if count_tokens(text.strip()) <= max_tokens:
        return [text.strip()] if text.strip() else []
    return [text[a:b].strip() for a, b in _pack(text, 0, len(text), max_tokens, count_tokens, 0)
            if text[a:b].strip()]


_LEVELS = (SENTENCE, CLAUSE, WORD)


def _pack(text: str, start: int, end: int, limit: int, count: Callable[[str], int],
          level: int) -> Iterator[tuple[int, int]]:
    """Spans covering ``text[start:end]``, each within ``limit`` tokens, from units of ``level``."""
    if level == len(_LEVELS):
        yield from _cut_characters(text, start, end, limit, count)
        return
    piece = start  # start of the piece being grown; it ends at ``last``
    last = start
    for unit_end in _cuts(text, start, end, _LEVELS[level]):
        if count(text[piece:unit_end].strip()) <= limit:
            last = unit_end
            continue
        if last > piece:  # the piece so far is full: close it, the unit starts the next one
            yield piece, last
            piece = last
            if count(text[piece:unit_end].strip()) <= limit:
                last = unit_end
                continue
        yield from _pack(text, piece, unit_end, limit, count, level + 1)  # the unit alone is too long
        piece = last = unit_end
    if last > piece:
        yield piece, last


def _cut_characters(text: str, start: int, end: int, limit: int,
                    count: Callable[[str], int]) -> Iterator[tuple[int, int]]:
    """Spans of the longest prefixes that fit (binary search; at least one character each)."""
    while start < end:
        lo, hi = start + 1, end
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[start:mid].strip()) <= limit:
                lo = mid
            else:
                hi = mid - 1
        yield start, lo
        start = lo


# ------------------------------------------------------------------ a text still being written
def written_cut(text: str, start: int, closed: bool, max_tokens: int,
                count_tokens: Callable[[str], int]) -> tuple[int, int] | None:
    """Where the piece of ``text`` that starts at ``start`` ends, decided from what has arrived: ``(end, next)``
    (the piece is ``text[start:end]``, the next one starts at ``next``), or None when more text is needed to
    tell. ``closed``: the text has ended. The rule reads the text only forwards, so a text still being written
    (``TTS.stream_text``) is cut where the whole text is (``split_written``), however it arrived:

    1. the first sentence end at which the piece holds at least half of ``max_tokens`` (and at most all of it);
    2. at the end of the text, the rest;
    3. a piece past ``max_tokens`` with no such sentence end: its last clause end, else its last word end, at
       which it holds at least half, else the longest prefix that fits.

    Every cut holds at least half of ``max_tokens`` but a text's last, so the text before that point
    (``written_safe``) is never cut and may be read before the cut is known."""
    half = (max_tokens + 1) // 2
    rest = count_tokens(text[start:].strip())
    if rest < half:  # no cut holds fewer than half: the rest, once the text has ended
        return (len(text), len(text)) if closed else None
    for m in SENTENCE.finditer(text, start):
        end = m.end()
        n = count_tokens(text[start:end].strip())
        if n > max_tokens:
            break
        if n >= half:
            if end == len(text) and not closed:
                return None  # "Hi." may become "Hi.." or "Hi.x"
            return _after(text, start, end)
    if rest <= max_tokens:
        return (len(text), len(text)) if closed else None
    for pattern in (CLAUSE, WORD):
        best = None
        for m in pattern.finditer(text, start):
            end = m.end() if pattern is CLAUSE else m.start()
            if end <= start:
                continue
            if pattern is CLAUSE and end == len(text) and not closed:
                return None  # "3," may become "3,000"
            n = count_tokens(text[start:end].strip())
            if n > max_tokens:
                break
            if n >= half:
                best = end
        if best is not None:
            return _after(text, start, best)
    lo, hi = start + 1, len(text)  # the longest prefix that fits (one character at least)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count_tokens(text[start:mid].strip()) <= max_tokens else (lo, mid - 1)
    return _after(text, start, lo)


def _after(text: str, start: int, end: int) -> tuple[int, int]:
    """The piece ``text[start:end]`` without its trailing whitespace, and the next piece's start past it."""
    nxt = end
    while nxt < len(text) and text[nxt].isspace():
        nxt += 1
    stop = end
    while stop > start and text[stop - 1].isspace():
        stop -= 1
    return stop, nxt


def written_safe(text: str, start: int, max_tokens: int, count_tokens: Callable[[str], int]) -> int:
    """How far the piece that starts at ``start`` may be read before its cut is known: the text before the
    point where it holds half of ``max_tokens`` (``written_cut`` never cuts sooner)."""
    half = (max_tokens + 1) // 2
    if count_tokens(text[start:].strip()) < half:
        return len(text)
    lo, hi = start, len(text)  # the longest prefix holding fewer than half
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count_tokens(text[start:mid].strip()) < half else (lo, mid - 1)
    return lo


def split_written(text: str, max_tokens: int, count_tokens: Callable[[str], int]) -> list[str]:
    """``text`` in the pieces ``written_cut`` cuts it into (the streaming text mode's long text): the first keeps
    its leading whitespace and the last its trailing whitespace, as a text spoken in one piece does."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    out, start = [], 0
    while start < len(text):
        end, nxt = written_cut(text, start, True, max_tokens, count_tokens)
        if text[start:end].strip():
            out.append(text[start:end])
        start = nxt
    return out
