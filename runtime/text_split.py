"""Long text -> pieces that each fit one Talker context (pure Python, no numpy).

A piece is a slice of the text (stripped of surrounding whitespace), so the pieces, joined, are the
text modulo whitespace: nothing is dropped. Boundaries are tried from the coarsest to the finest:

1. sentences: ``. ! ? …`` (followed by a space, a line end or the text end), CJK ``。！？｡．`` and the
   full-width ``！？`` (no space needed), or a blank line; closing quotes and brackets stay with it;
2. clauses: ``, ; :`` (followed by a space), dashes ``— –``, CJK ``，、；：`` and their full-width forms;
3. whitespace (words);
4. characters: a run without spaces (CJK, a long URL) is cut at the longest prefix that fits.

Sentences (then clauses, words) are packed greedily: a piece grows while its token count stays
within the limit. Token counts come from the caller (the bundle's tokenizer), so the limit is in
the Talker's own units. How large the limit may be is ``kztts.tts``'s business: the prompt plus
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
# Japanese alike; Korean ~5 syllables/s at ~1.2 syllables/token, 5 frames. Too low an estimate
# makes a piece hit the context before its end of speech, which kztts.tts then reports.
FRAMES_PER_TOKEN = {"chinese": 6.0, "japanese": 6.0, "korean": 5.0}
DEFAULT_FRAMES_PER_TOKEN = 5.0


def script_language(text: str) -> str | None:
    """"chinese", "japanese" or "korean" when CJK characters make up at least a third of the
    letters of ``text`` (kana -> japanese, hangul -> korean, else chinese); None otherwise."""
    letters = han = kana = hangul = 0
    for ch in text:
        if not ch.isalpha():
            continue
        letters += 1
        name = unicodedata.name(ch, "")
        if name.startswith("CJK UNIFIED"):
            han += 1
        elif name.startswith(("HIRAGANA", "KATAKANA")):
            kana += 1
        elif name.startswith("HANGUL"):
            hangul += 1
    if not letters or 3 * (han + kana + hangul) < letters:
        return None
    if hangul >= max(han, kana):
        return "korean"
    return "japanese" if kana else "chinese"


def frames_per_token(language: str | None, text: str) -> float:
    """The upper estimate of frames per token for ``language`` (a manifest language name), or,
    for None/"auto", for the script ``text`` is mostly written in."""
    name = (language or "auto").lower()
    if name == "auto":
        name = script_language(text) or ""
    return FRAMES_PER_TOKEN.get(name, DEFAULT_FRAMES_PER_TOKEN)


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
