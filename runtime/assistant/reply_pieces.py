"""A reply's text -> the utterances it is spoken in, as the text arrives (``ReplyCutter``) or whole
(``reply_pieces``); both give the same pieces for the same text, however it was cut into tokens.

A piece ends at a sentence end of ``kztts.tts.text.split.SENTENCE`` (``. ! ?`` followed by white
space, CJK full stops, a blank line) or at a line end; a piece longer than ``MAX_WORDS`` words also
ends at its next clause mark (``, ; :``). An end is only taken once the character after it has arrived
(``3.5`` is no sentence end), so the pieces depend on the text alone. Markup a voice should not read
(``*``, ``#``, backquotes, ``_`` runs) is dropped, and a piece without a letter or digit is not spoken."""
from __future__ import annotations

import re

from kztts.tts.text.split import CLAUSE, SENTENCE

MAX_WORDS = 30  # a piece this long ends at its next clause mark: the listener waits for a whole piece
_LINE = re.compile(r"\n")
_MARKUP = re.compile(r"[*#`]+|_{2,}")
_SPOKEN = re.compile(r"\w")


def clean(piece: str) -> str | None:
    """The piece as it is spoken (markup dropped, white space collapsed), or None when nothing is left."""
    text = " ".join(_MARKUP.sub("", piece).split())
    return text if _SPOKEN.search(text) else None


class ReplyCutter:
    """Feed the reply's text as it arrives (``feed``), then ``end``; each returns the pieces completed."""

    def __init__(self, max_words: int = MAX_WORDS):
        self.max_words = max_words
        self._buffer = ""

    def _next_end(self, final: bool) -> int | None:
        """Where the buffer's first piece ends, if that is known yet."""
        text = self._buffer
        ends = []
        for pattern in (SENTENCE, _LINE):
            for m in pattern.finditer(text):
                if m.end() < len(text) or final:  # the next character is there (or none will come)
                    ends.append(m.end())
                    break
        if len(text.split()) > self.max_words:
            words = 0
            for m in re.finditer(r"\S+", text):
                words += 1
                if words > self.max_words:
                    clause = CLAUSE.search(text, m.start())
                    if clause is not None and (clause.end() < len(text) or final):
                        ends.append(clause.end())
                    break
        return min(ends) if ends else None

    def _take(self, final: bool) -> list[str]:
        pieces = []
        while (end := self._next_end(final)) is not None:
            piece, self._buffer = self._buffer[:end], self._buffer[end:]
            if (spoken := clean(piece)) is not None:
                pieces.append(spoken)
        return pieces

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        return self._take(final=False)

    def end(self) -> list[str]:
        """The pieces left once the reply is complete."""
        pieces = self._take(final=True)
        rest, self._buffer = self._buffer, ""
        if (spoken := clean(rest)) is not None:
            pieces.append(spoken)
        return pieces


def reply_pieces(text: str, max_words: int = MAX_WORDS) -> list[str]:
    """The pieces of a whole reply (``ReplyCutter`` fed it at once)."""
    cutter = ReplyCutter(max_words)
    return cutter.feed(text) + cutter.end()


class SpokenText:
    """A reply's text as it is spoken, cleaned as it arrives: markup a voice should not read (``*``, ``#``,
    backquotes, runs of ``_``) dropped, white space collapsed to one space, none at the ends; what comes out of
    ``feed`` and ``end``, joined, is ``spoken_text`` of the whole reply however it was cut. ``speakable``: a
    letter or digit has come out (a reply without one is not spoken)."""

    def __init__(self):
        self._underscores = 0  # a run of "_" not yet known to be one (kept) or more (dropped)
        self._space = False  # white space seen since the last character given out
        self._started = False
        self.speakable = False

    def feed(self, piece: str) -> str:
        out = []
        for ch in piece:
            if ch == "_":
                self._underscores += 1
                continue
            self._flush_underscores(out)
            if ch in "*#`":
                continue
            if ch.isspace():
                self._space = True
                continue
            self._put(out, ch)
        return "".join(out)

    def end(self) -> str:
        out: list[str] = []
        self._flush_underscores(out)
        return "".join(out)

    def _flush_underscores(self, out: list[str]) -> None:
        if self._underscores == 1:
            self._put(out, "_")
        self._underscores = 0

    def _put(self, out: list[str], ch: str) -> None:
        if self._space and self._started:
            out.append(" ")
        self._space = False
        self._started = True
        out.append(ch)
        if not self.speakable and _SPOKEN.match(ch):
            self.speakable = True


def spoken_text(text: str) -> str:
    """A whole reply's text as it is spoken (``SpokenText``)."""
    cleaner = SpokenText()
    return cleaner.feed(text) + cleaner.end()
