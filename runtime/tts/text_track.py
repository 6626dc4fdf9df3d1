"""Text as it is written: the text tokens of a text that is still arriving (``TextTrack``), and the
text side of qwen-tts's streaming text mode built from them one row at a time (``DualTrack``).

Qwen3-TTS reads one text token per frame in its streaming text mode (qwen-tts ``non_streaming_mode=False``):
the prompt holds the first text position and the frame ``k`` after it takes in the next one
(``kztts.tts.prompt``). So speech may start once the first token is known, and frame ``k`` needs only the
tokens up to ``k + 1``. A token is *committed* once no later text can change it: the tokenizer splits a
text into pre-tokens (words, runs of digits, punctuation, whitespace) by its own pre-tokenizer, BPE merges
only within a pre-token, and appending text can change only the last pre-token of what has arrived (the
one that touches its end). So the tokens of every pre-token but the last are those of the whole text,
however the text was cut into pieces; the last is committed when the next one starts, or when the text
ends. A frame whose token is not committed yet waits for more text: nothing is fed early.

``TextTrack`` pulls the pieces from any iterable (an LM's tokens, a pipe's lines, a WebSocket's
messages), in the consumer's thread, only when a token is needed that has not arrived.
"""
from __future__ import annotations

import time
import unicodedata
from typing import Iterable, Iterator

import numpy as np

from kztts.bundle.embeddings import EmbeddingTables
from kztts.core.errors import KzttsError
from kztts.tts.text import TextTokenizer, assistant_text
from kztts.tts.text_split import written_cut, written_safe

# What precedes the text in its pre-tokenizer segment: the assistant template's "<|im_start|>" is a
# special token, so the text is pre-tokenized together with "assistant\n" (a leading newline or space of
# the text may merge with that "\n")
_SEGMENT_HEAD = "assistant\n"


class TextSourceError(KzttsError):
    """The text source raised while the speech was under way (the error it raised is ``__cause__``)."""


class TextSource:
    """Text pieces pulled one at a time from any iterable, each checked: ``text`` (what has arrived),
    ``closed`` (the iterable has ended), and when the first text came and how long was spent waiting."""

    def __init__(self, pieces: Iterable[str]):
        if isinstance(pieces, (str, bytes)):
            raise KzttsError("give the text as an iterable of pieces (e.g. a list of strings or a generator); "
                             "a single string is a whole text: use synthesize or stream")
        try:
            self._it: Iterator[str] = iter(pieces)
        except TypeError:
            raise KzttsError(f"the text pieces must be an iterable of strings, got {type(pieces).__name__}") from None
        self.text = ""
        self.closed = False
        self.pieces = 0  # pieces received
        self.first_text_at: float | None = None  # time.perf_counter() of the first non-empty piece
        self.wait_seconds = 0.0  # time spent waiting for the source

    def pull(self) -> None:
        """One more piece (blocking), or the end of the text. A source that raises ends in one
        ``TextSourceError`` (its own error is the cause); a piece that is not a string is refused."""
        t = time.perf_counter()
        try:
            piece = next(self._it)
        except StopIteration:
            self.closed = True
            return
        except KzttsError:
            raise
        except Exception as exc:
            raise TextSourceError(f"the text source failed after {len(self.text)} characters "
                                  f"({type(exc).__name__}: {exc}); the speech stops there") from exc
        finally:
            self.wait_seconds += time.perf_counter() - t
        if not isinstance(piece, str):
            raise KzttsError(f"text piece {self.pieces + 1} must be a string, got {type(piece).__name__}")
        self.pieces += 1
        if piece and self.first_text_at is None:
            self.first_text_at = time.perf_counter()
        self.text += piece


class TextTrack:
    """The committed text tokens of a text whose pieces arrive from ``pieces`` (module docstring).

    ``tokens``: the committed text tokens (``ids[3:-5]`` of the assistant template, as
    ``TextTokenizer.assistant_ids`` slices them for the whole text); ``closed``: the source has ended
    and every token is committed; ``text``: what has arrived. ``need(n)`` waits (pulls pieces) until
    ``n`` tokens are committed or the text has ended."""

    def __init__(self, tokenizer: TextTokenizer, pieces: Iterable[str]):
        self.source = TextSource(pieces)
        self._tokenizer = tokenizer
        self._raw = tokenizer._tok
        self.tokens: list[int] = []
        self.role: list[int] | None = None  # ids[:3] of the template (known with the first token)

    @property
    def text(self) -> str:
        return self.source.text

    @property
    def closed(self) -> bool:
        return self.source.closed

    def pull(self) -> None:
        """One more piece from the source (blocking), or the end of the text; commits what it allows."""
        self.source.pull()
        if self.source.closed:
            self._close()
        else:
            self._commit()

    def need(self, n: int) -> bool:
        """Wait until ``n`` tokens are committed (True) or the text has ended with fewer (False)."""
        while len(self.tokens) < n and not self.closed:
            self.pull()
        return len(self.tokens) >= n

    def read_all(self) -> None:
        """Wait for the end of the text."""
        while not self.closed:
            self.pull()

    # ------------------------------------------------------------ committing tokens
    def _normalized(self) -> str:
        norm = self._raw.normalizer
        return norm.normalize_str(self.text) if norm is not None else unicodedata.normalize("NFC", self.text)

    def _ids(self, text: str) -> list[int]:
        """The assistant template's ids around ``text``."""
        return [int(i) for i in self._tokenizer.encode(assistant_text(text))]

    def _commit(self) -> None:
        """Commit the tokens of every pre-token but the last (all of them once closed)."""
        text = self._normalized()
        if not self.closed:
            pieces = self._raw.pre_tokenizer.pre_tokenize_str(_SEGMENT_HEAD + text)
            cut = pieces[-1][1][0] - len(_SEGMENT_HEAD) if len(pieces) > 1 else 0
            if cut <= 0:
                return
            text = text[:cut]
        ids = self._ids(text)
        tokens = ids[3:-5]
        if tokens[:len(self.tokens)] != self.tokens:  # the pre-tokenizer's boundaries are what make this hold
            raise RuntimeError(f"committed text tokens changed when more text arrived ({len(self.tokens)} committed, "
                               f"text {self.text[:60]!r}...)")
        self.tokens = tokens
        if tokens:
            self.role = ids[:3]

    def _close(self) -> None:
        if not self.text.strip():
            raise KzttsError("the text is empty; give some text to speak")
        self._commit()
        if not self.tokens:
            raise KzttsError(f"text {self.text[:60]!r} gives no tokens to speak")


class DualTrack:
    """The text rows of the streaming text mode for a text still arriving: row ``j`` of
    ``[T(ref_text ++ text), tts_eos]``, then ``tts_pad`` for ever (``kztts.tts.prompt``: the prompt takes the
    first rows, each frame the next one). ``ref_body``: an ICL voice's reference text tokens (none for an
    x-vector voice). A row's projection is computed once, with those committed with it."""

    def __init__(self, tables: EmbeddingTables, track: TextTrack, ref_body: np.ndarray | None = None):
        self.tables = tables
        self.track = track
        self.ref = np.asarray(ref_body if ref_body is not None else np.zeros(0, np.int64), dtype=np.int64)
        self._rows: list[np.ndarray] = []  # T(ref ++ committed tokens), as far as computed
        self.waited_rows = 0  # rows that had to wait for text

    def known(self, j: int) -> bool:
        """Whether row ``j`` can be given without waiting."""
        k = j - len(self.ref)
        return k < len(self.track.tokens) or self.track.closed

    def _project_new(self) -> None:
        ids = np.concatenate([self.ref, np.asarray(self.track.tokens, dtype=np.int64)])
        if len(ids) > len(self._rows):
            self._rows.extend(self.tables.text(ids[len(self._rows):]))

    def row(self, j: int) -> np.ndarray:
        """Row ``j`` of the text track, waiting for the text it needs."""
        if not self.known(j):
            self.waited_rows += 1
        if not self.track.need(j - len(self.ref) + 1) and j >= len(self.ref):
            n = len(self.ref) + len(self.track.tokens)
            return self.tables.tts_eos if j == n else self.tables.tts_pad
        self._project_new()
        return self._rows[j]

    def rows(self, n: int) -> np.ndarray:
        """Rows ``0..n-1``, [n, H]."""
        return np.stack([self.row(j) for j in range(n)]) if n else np.zeros((0, self.tables.hidden), np.float32)


class WrittenText:
    """A text still arriving from ``pieces``, cut into the pieces a text too long for one utterance is spoken
    in (``kztts.tts.text_split.written_cut``, where ``split_written`` cuts the whole text): ``next_piece()``
    gives the next piece's text as an iterable for its ``TextTrack`` (text the cut cannot move is given as it
    comes, the rest once its cut is known), or None once the text has ended. ``max_tokens``: the most text
    tokens a piece may hold (None: one piece, however long)."""

    def __init__(self, tokenizer: TextTokenizer, pieces: Iterable[str], max_tokens: int | None):
        self._source = TextSource(pieces)
        self._tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.start = 0  # where the current piece starts
        self.released = 0  # the text given to the current piece so far
        self.count = 0  # pieces begun

    @property
    def text(self) -> str:
        return self._source.text

    def _tokens(self, s: str) -> int:
        return len(self._tokenizer.text_body(self._tokenizer.encode(assistant_text(s)))) if s else 0

    def _pull(self) -> None:
        if not self._source.closed:
            self._source.pull()

    def next_piece(self) -> Iterator[str] | None:
        """The next piece's text, or None when no text is left (waits until that is known)."""
        src = self._source
        while not self.text[self.start:].strip() and not src.closed:
            self._pull()
        if not self.text[self.start:].strip():
            if self.count == 0:  # TextTrack refuses an empty text in its words
                return iter(())
            return None
        self.count += 1
        return self._piece()

    def _piece(self) -> Iterator[str]:
        src = self._source
        while True:
            if self.max_tokens is None:
                cut = (len(self.text), len(self.text)) if src.closed else None
                safe = len(self.text)
            else:
                cut = written_cut(self.text, self.start, src.closed, self.max_tokens, self._tokens)
                safe = cut[0] if cut else written_safe(self.text, self.start, self.max_tokens, self._tokens)
            if safe > self.released:
                yield self.text[self.released:safe]
                self.released = safe
            if cut is not None:
                self.start = self.released = cut[1]
                return
            self._pull()
