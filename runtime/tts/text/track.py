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
from typing import Callable, Iterable, Iterator

import numpy as np

from kztts.bundle.embeddings import EmbeddingTables
from kztts.core.errors import KzttsError
from kztts.tts.text.tokenizer import TextTokenizer, assistant_text
from kztts.tts.text.split import written_cut, written_safe

# What precedes the text in its pre-tokenizer segment: the assistant template's "<|im_start|>" is a
# special token, so the text is pre-tokenized together with "assistant\n" (a leading newline or space of
# the text may merge with that "\n")
_SEGMENT_HEAD = "assistant\n"


class TextSourceError(KzttsError):
    """The text source raised while the speech was under way (the error it raised is ``__cause__``)."""


class TextFeed:
    """Text written by one thread and spoken by another (a server's connection, an LM's thread): ``write``
    pieces, then ``close`` (or ``fail`` with the error that ended it). Iterating it yields the pieces, waiting
    for each; ``ready()`` tells without waiting whether a piece or the end is there, so a loop serving many
    texts (``kztts.tts.batch_loop``) reads only what has come."""

    def __init__(self):
        import queue

        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._end = object()
        self.closed = False  # the writer's side
        self.on_write: "Callable[[], object] | None" = None  # called after each write, close or fail (a reader's wake)

    def _put(self, item) -> None:
        self._queue.put(item)
        if self.on_write is not None:
            self.on_write()

    def write(self, piece: str) -> None:
        if self.closed:
            raise KzttsError("this text has ended: no text may follow its end")
        if not isinstance(piece, str):
            raise KzttsError(f"a text piece must be a string, got {type(piece).__name__}")
        self._put(piece)

    def close(self) -> None:
        """The end of the text."""
        if not self.closed:
            self.closed = True
            self._put(self._end)

    def fail(self, exc: BaseException) -> None:
        """End the text with ``exc``: the reader raises it (as ``TextSourceError``) after the text so far."""
        if not self.closed:
            self.closed = True
            self._put(exc)

    def ready(self) -> bool:
        return not self._queue.empty()

    def __iter__(self) -> Iterator[str]:
        while True:
            item = self._queue.get()
            if item is self._end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


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
        self._ready = getattr(pieces, "ready", None)  # a TextFeed tells whether a piece waits
        self.pieces_of = pieces  # what the pieces come from

    def ready(self) -> bool:
        """Whether ``pull`` would return without waiting (always True for a source that cannot tell)."""
        return self.closed or self._ready is None or self._ready()

    def waiting(self) -> bool:
        """Whether a piece (or the end) is known to be there now: only a source that can tell (a ``TextFeed``)
        is ever read without waiting."""
        return not self.closed and self._ready is not None and self._ready()

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

    def poll(self) -> None:
        """Pull every piece that has come, without waiting (a ``TextFeed``'s; another source is never polled)."""
        while self.source.waiting():
            self.pull()

    def need(self, n: int) -> bool:
        """Wait until ``n`` tokens are committed (True) or the text has ended with fewer (False)."""
        while len(self.tokens) < n and not self.closed:
            self.pull()
        return len(self.tokens) >= n

    def read_all(self) -> None:
        """Wait for the end of the text."""
        while not self.closed:
            self.pull()

    def first_guess(self) -> tuple[list[int], int] | None:
        """While no token is committed: (the template's role ids, the first text token) of the text arrived so
        far as if it ended there, waiting for some text first. A guess, which more text can still change (the
        first word may go on); None once a token is committed or the text has ended (nothing to guess)."""
        while not self.tokens and not self.closed and not self.text.strip():
            self.pull()
        if self.tokens or self.closed:
            return None
        ids = self._ids(self._normalized())
        return (ids[:3], ids[3]) if len(ids[3:-5]) else None

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
        """Whether row ``j`` can be given without waiting (for a ``TextFeed``, once ``track.poll()`` has read what
        came)."""
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
    in (``kztts.tts.text.split.written_cut``, where ``split_written`` cuts the whole text): ``next_piece()``
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
        self._current: PieceText | None = None

    @property
    def text(self) -> str:
        return self._source.text

    def _tokens(self, s: str) -> int:
        return len(self._tokenizer.text_body(self._tokenizer.encode(assistant_text(s)))) if s else 0

    def _pull(self) -> None:
        if not self._source.closed:
            self._source.pull()

    def close_source(self) -> None:
        """The reader has left: a ``TextFeed`` source is ended, so its writer is refused from now on."""
        feed = self._source.pieces_of
        if isinstance(feed, TextFeed):
            feed.close()

    def next_ready(self) -> bool:
        """Whether ``next_piece`` would answer without waiting (pulls what a ``TextFeed`` holds)."""
        src = self._source
        if self._current is not None and not self._current.skip_rest(wait=False):
            return False
        while not self.text[self.start:].strip() and src.waiting():
            self._pull()
        return bool(self.text[self.start:].strip()) or src.closed

    def next_piece(self) -> "PieceText | None":
        """The next piece's text, or None when no text is left (waits until that is known). What the piece before
        left unread (its speech ended first: its end of speech, or a frame cap) is skipped, as ``synthesize``
        leaves the rest of a piece unspoken."""
        src = self._source
        if self._current is not None:
            self._current.skip_rest(wait=True)
        while not self.text[self.start:].strip() and not src.closed:
            self._pull()
        if not self.text[self.start:].strip():
            if self.count == 0:  # TextTrack refuses an empty text in its words
                return PieceText(self, empty=True)
            return None
        self.count += 1
        self._current = PieceText(self)
        return self._current

    def _cut(self) -> tuple[tuple[int, int] | None, int]:
        """The current piece's cut if known, and how far it may be read."""
        if self.max_tokens is None:
            return ((len(self.text), len(self.text)) if self._source.closed else None), len(self.text)
        cut = written_cut(self.text, self.start, self._source.closed, self.max_tokens, self._tokens)
        return cut, cut[0] if cut else written_safe(self.text, self.start, self.max_tokens, self._tokens)


class PieceText:
    """One piece of a ``WrittenText``: iterating it yields the piece's text as it may be read (waiting for
    more), and ``ready()`` tells whether the next item would come without waiting (as ``TextFeed.ready``)."""

    def __init__(self, written: WrittenText, empty: bool = False):
        self._w = written
        self._done = empty
        self.start = written.start
        self.end: int | None = None  # where the piece ends, once its cut is known

    def __iter__(self) -> Iterator[str]:
        w = self._w
        while not self._done:
            cut, safe = w._cut()
            if safe > w.released:
                text, w.released = w.text[w.released:safe], safe
                yield text
            if cut is not None:
                self.end = cut[0]
                w.start = w.released = cut[1]
                self._done = True
                return
            w._pull()

    @property
    def text(self) -> str | None:
        """The piece's whole text, once its cut is known."""
        return None if self.end is None else self._w.text[self.start:self.end]

    def skip_rest(self, wait: bool) -> bool:
        """Read the piece to its cut without keeping it (``wait``: however long that takes, else only what has
        come); whether the piece is done."""
        it = iter(self)
        while not self._done and (wait or self.ready()):
            next(it, None)
        return self._done

    def ready(self) -> bool:
        if self._done:
            return True
        w = self._w
        cut, safe = w._cut()
        return cut is not None or safe > w.released or w._source.ready()
