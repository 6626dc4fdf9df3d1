"""A request ready to speak (``PreparedSpeech``): checked once against the bundle's kind, who speaks resolved,
its settings fixed, its text tokenized once and cut into the pieces that each fit one Talker context; each
piece becomes an ``Utterance`` (its prompt, frame cap and frame loop) when its turn comes. A text still
arriving (``TTS.stream_text``) is prepared the same way, its one utterance reading the text as it comes.

Every way of speaking goes through here: ``TTS.synthesize``, ``stream``, ``stream_text``, ``generate_codes``,
a long text's pieces, the batch loop and the server.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Iterable, Iterator

import numpy as np

from kztts.core.errors import ContextOverflowError, KzttsError
from kztts.generation.sampling import XorShift32
from kztts.generation.settings import GenerationSettings
from kztts.tts.duration import runaway_frames
from kztts.tts.frame_loop import FrameLoop
from kztts.tts.prompt import Prompt, build_prompt, build_track_prompt, prompt_length, speaker_language_id
from kztts.tts.request import SynthesisRequest, Voice
from kztts.tts.text.tokenizer import assistant_text
from kztts.tts.text.split import WRITTEN_AUTO_FRAMES_PER_TOKEN, frames_per_token, split_text, split_written
from kztts.tts.text.track import DualTrack, TextTrack, WrittenText
from kztts.tts.utterance import Utterance

# kztts.tts.tts imports this module: the TTS a request is prepared for is named, not imported

log = logging.getLogger(__name__)


class PreparedSpeech:
    """``request`` checked for ``tts`` (one line naming what is wrong), ready to be spoken in ``texts``
    (one piece, or a long text's pieces). ``utterance(i)`` starts piece ``i``."""

    def __init__(self, tts: "TTS", request: SynthesisRequest, *, written: bool = False):
        if request.voice is None and request.speaker is None and tts.kind.kind != "voice_design":
            request = replace(request, voice=tts.default_voice())  # who speaks when no one is named: one rule
        self.tts, self.request = tts, request
        tts.kind.check(request)
        self.voice: Voice | None = (tts.voice_from_speaker(request.speaker) if request.speaker is not None
                                    else request.voice)
        self.settings = self._settings()
        dialect = (tts.kind.speaker(self.voice.preset).dialect if self.voice is not None and self.voice.preset
                   else None)
        self.language_id = speaker_language_id(tts.bundle.manifest.languages, request.language, dialect)
        self.icl = self.voice is not None and self.voice.icl
        tok = tts.tokenizer
        self.ref_ids = tok.ref_ids(self.voice.ref_text) if self.icl else None
        self.instruct_ids = tok.instruct_ids(request.instruct) if request.instruct else None
        self._ids: np.ndarray | None = None
        if written:  # the text arrives while it is spoken: one utterance (TTS.stream_text)
            self.texts = [""]
            return
        self._ids = tok.assistant_ids(request.text)  # refuses an empty text
        self.texts = self._split()

    def _settings(self) -> GenerationSettings:
        """The request's settings: its own or the checkpoint's, greedy and ``max_frames`` applied."""
        r = self.request
        s = r.settings or self.tts.default_settings()
        if r.greedy:
            s = s.greedy()
        if r.max_frames is not None:
            s = replace(s, max_frames=int(r.max_frames))
        return s.validate()

    # ------------------------------------------------------------ a long text's pieces
    def _split(self) -> list[str]:
        """``[text]`` when the prompt plus the frames the text is expected to need (at most ``max_frames``) fit
        in the Talker's context, else the pieces of the text that each do (``kztts.tts.text.split``: sentences,
        clauses, words, characters). Expected frames: ``frames_per_token`` (an upper estimate for the language)
        times the text tokens; the bound is ``prompt + frames - 1 <= context``."""
        r, tok, context = self.request, self.tts.tokenizer, self.tts.talker.context
        ref_text = len(tok.ref_body(self.ref_ids)) if self.icl else 0
        ref_frames = self.voice.ref_codes.shape[0] if self.icl else 0
        instruct = len(self.instruct_ids) if self.instruct_ids is not None else 0
        rate = frames_per_token(r.language, r.text)

        def needed(tokens: int) -> int:
            positions = prompt_length(tokens, language=self.language_id is not None, speaker=self.voice is not None,
                                      mode="icl" if self.icl else "xvector", non_streaming=not r.streaming_text,
                                      ref_text_tokens=ref_text, ref_frames=ref_frames, instruct_tokens=instruct)
            return positions + min(math.ceil(rate * tokens), self.settings.max_frames) - 1

        def count(piece: str) -> int:
            return len(tok.text_body(tok.encode(assistant_text(piece)))) if piece else 0

        tokens = len(tok.text_body(self._ids))
        if r.streaming_text:  # cut as a text still being written is (TTS.stream_text)
            limit = self.written_limit()
            texts = [r.text] if limit is None else split_written(r.text, limit, count)
            if len(texts) > 1:
                log.info("text of %d tokens spoken in %d pieces of at most %d tokens (streaming text mode)",
                         tokens, len(texts), limit)
            return texts
        if needed(tokens) <= context:
            return [r.text]
        if needed(1) > context:
            raise ContextOverflowError(
                f"the Talker's context of {context} positions cannot hold the prompt and the frames of even one "
                f"text token ({needed(1)} positions); use a shorter reference recording or a larger context")
        lo, hi = 1, tokens  # the most tokens a piece may have: needed() only grows with tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if needed(mid) <= context else (lo, mid - 1)
        texts = split_text(r.text, lo, count)
        log.info("text of %d tokens spoken in %d pieces of at most %d tokens (%.1f frames per token expected, "
                 "context %d)", tokens, len(texts), lo, rate, context)
        return texts

    def written_limit(self) -> int | None:
        """The most text tokens a piece may hold in the streaming text mode (None: no limit), where the prompt's
        positions do not grow with the text: its frames, at the language's frames per token (the largest
        estimate for auto: the text's scripts may not be known yet) and at most ``max_frames``, must fit the
        Talker's context beside the prompt."""
        r, tok, context = self.request, self.tts.tokenizer, self.tts.talker.context
        positions = prompt_length(1, language=self.language_id is not None, speaker=self.voice is not None,
                                  mode="icl" if self.icl else "xvector", non_streaming=False,
                                  ref_text_tokens=len(tok.ref_body(self.ref_ids)) if self.icl else 0,
                                  ref_frames=self.voice.ref_codes.shape[0] if self.icl else 0,
                                  instruct_tokens=len(self.instruct_ids) if self.instruct_ids is not None else 0)
        language = (r.language or "auto").lower()
        rate = WRITTEN_AUTO_FRAMES_PER_TOKEN if language == "auto" else frames_per_token(language, "")
        max_frames = self.settings.max_frames

        def needed(tokens: int) -> int:
            return positions + min(math.ceil(rate * tokens), max_frames) - 1

        if needed(max_frames) <= context:
            return None
        if needed(1) > context:
            raise ContextOverflowError(
                f"the Talker's context of {context} positions cannot hold the prompt and the frames of even one "
                f"text token ({needed(1)} positions); use a shorter reference recording or a larger context")
        lo, hi = 1, max_frames
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if needed(mid) <= context else (lo, mid - 1)
        return lo

    # ------------------------------------------------------------ utterances
    def label(self, index: int) -> str:
        """How warnings and limits name piece ``index``."""
        return f"piece {index + 1}/{len(self.texts)}" if len(self.texts) > 1 else "the text"

    def prompt(self, index: int | None = None) -> Prompt:
        """The Talker prompt of piece ``index``, or of the whole text (None) however long, as qwen-tts builds it."""
        tts, voice = self.tts, self.voice
        ids = self._ids if index is None else tts.tokenizer.assistant_ids(self.texts[index])
        return build_prompt(tts.tables, ids, special_ids=tts.bundle.manifest.special_ids,
                            language_id=self.language_id, speaker=None if voice is None else voice.speaker,
                            mode="icl" if self.icl else "xvector", non_streaming=not self.request.streaming_text,
                            ref_text_ids=self.ref_ids, ref_codes=voice.ref_codes if self.icl else None,
                            instruct_ids=self.instruct_ids)

    def utterance(self, index: int = 0, label: str | None = None) -> Utterance:
        """Piece ``index`` ready to run: its prompt, its settings with the frame cap that fits, its frame loop."""
        started = time.perf_counter()
        tts, r = self.tts, self.request
        text = self.texts[index]
        request = r if len(self.texts) == 1 else replace(r, text=text)
        prompt = self.prompt(None if len(self.texts) == 1 else index)
        s = self.settings
        context = tts.talker.context
        if prompt.embeds.shape[0] > context:
            raise ContextOverflowError(
                f"the text is too long: its prompt takes {prompt.embeds.shape[0]} positions, the context holds "
                f"{context}; split the text into shorter pieces")
        limited_by = "max_frames"
        if r.max_frames is None and runaway_frames(text, r.language) < s.max_frames:
            # no cap asked for: a model that fails to stop ends at 3x the text's expected duration
            s = replace(s, max_frames=runaway_frames(text, r.language))
            limited_by = "expected duration"
        if prompt.embeds.shape[0] + s.max_frames - 1 > context:
            s = replace(s, max_frames=context - prompt.embeds.shape[0] + 1)
            limited_by = "context"  # said (warning, result.limits) only if it cuts the speech: Utterance.limit
            log.info("max frames lowered to %d to fit the context of %d", s.max_frames, context)
        loop = self._loop(s)
        loop.times.prompt = time.perf_counter() - started
        return Utterance(loop, prompt, request, started, limited_by, label or self.label(index),
                         random_weights=bool(self.tts.bundle.manifest.random_weights))

    def written_utterances(self, pieces: Iterable[str], guess: bool = False) -> Iterator[Utterance]:
        """The utterances of a text still arriving from ``pieces``: one, or a long text's pieces cut where
        ``synthesize(whole_text, streaming_text=True)`` cuts them (``kztts.tts.text.track.WrittenText``), each
        started when the one before has ended. ``guess``: as ``written_utterance``'s."""
        written = self.written_text(pieces)
        while (source := written.next_piece()) is not None:
            yield self.written_utterance(source, written_label(written), guess)

    def written_text(self, pieces: Iterable[str]) -> WrittenText:
        """``pieces`` as a text still arriving, cut where this request's text would be."""
        return WrittenText(self.tts.tokenizer, pieces, self.written_limit())

    def written_utterance(self, pieces: Iterable[str], label: str = "the text", guess: bool = False) -> Utterance:
        """The utterance of a text still arriving from ``pieces``: the prompt waits for the text rows its
        prefill holds, and the frame cap from the text's expected duration is decided as the text arrives.
        ``guess``: an x-vector prompt is prefilled on its first text token guessed from the first text, and
        confirmed once the token is committed (``kztts.tts.prompt.TrackPrompt``): the wait for the next
        piece overlaps the prefill."""
        return self.pending_utterance(pieces, label).utterance(guess)

    def pending_utterance(self, pieces: Iterable[str], label: str = "the text") -> "PendingUtterance":
        """``written_utterance`` in two steps: ``ready()`` tells without waiting whether its prompt's text has
        come (a ``TextFeed``), then ``utterance()``."""
        return PendingUtterance(self, pieces, label)

    def _loop(self, settings: GenerationSettings, capped=None) -> FrameLoop:
        tts = self.tts
        return FrameLoop(tts.talker, tts.code_predictor, tts.tables, settings,
                         int(tts.bundle.manifest.special_ids["codec_eos"]), XorShift32(self.request.seed),
                         prefixes=tts.voice_prefixes, capped=capped)


class PendingUtterance:
    """An utterance of a text still arriving, before its prompt is built (``PreparedSpeech.pending_utterance``)."""

    def __init__(self, prepared: PreparedSpeech, pieces: Iterable[str], label: str):
        self.prepared, self.label = prepared, label
        self.started = time.perf_counter()
        tts = prepared.tts
        self.track = TextTrack(tts.tokenizer, pieces)
        self.dual = DualTrack(tts.tables, self.track, tts.tokenizer.ref_body(prepared.ref_ids) if prepared.icl
                              else None)

    def _rows(self) -> int:
        """The text rows the prompt holds: the first (x-vector), or one per reference codec position (ICL)."""
        p = self.prepared
        return 1 + p.voice.ref_codes.shape[0] if p.icl else 1

    def ready(self) -> bool:
        """Whether ``utterance()`` would not wait for text (pulls what a ``TextFeed`` holds)."""
        self.track.poll()
        return self.track.role is not None and self.dual.known(self._rows() - 1) or self.track.closed

    def utterance(self, guess: bool = False) -> Utterance:
        """The utterance, its prompt built once its first text rows are committed; ``guess``: on a guessed
        first token, confirmed after the prefill (``PreparedSpeech.written_utterance``)."""
        p, tts = self.prepared, self.prepared.tts
        r, voice = p.request, p.voice
        prompt = build_track_prompt(tts.tables, self.dual, special_ids=tts.bundle.manifest.special_ids,
                                    language_id=p.language_id, speaker=None if voice is None else voice.speaker,
                                    mode="icl" if p.icl else "xvector",
                                    ref_codes=voice.ref_codes if p.icl else None, instruct_ids=p.instruct_ids,
                                    guess=guess)
        context = tts.talker.context
        if prompt.embeds.shape[0] > context:
            raise ContextOverflowError(f"the prompt takes {prompt.embeds.shape[0]} positions, the context holds "
                                       f"{context}; use a shorter reference recording")
        s, limited_by = p.settings, "max_frames"
        if context - prompt.embeds.shape[0] + 1 < s.max_frames:
            s, limited_by = replace(s, max_frames=context - prompt.embeds.shape[0] + 1), "context"
        loop = p._loop(s, DurationCap(self.track, r.language) if r.max_frames is None else None)
        loop.times.prompt = time.perf_counter() - self.started
        return Utterance(loop, prompt, r, self.started, limited_by, self.label, track=self.dual,
                         random_weights=bool(tts.bundle.manifest.random_weights))


def written_label(written: WrittenText) -> str:
    """How warnings and limits name the piece ``written`` began last."""
    return f"piece {written.count}" if written.count > 1 else "the text"


class DurationCap:
    """The frame cap of a text still arriving whose caller set none: 3x its expected duration
    (``kztts.tts.duration.runaway_frames``), decided only once the text known so far allows more frames
    or the text has ended, so that it equals the whole text's cap."""

    def __init__(self, track: TextTrack, language: str | None):
        self.track, self.language = track, language
        self._known = (-1, 0)  # (characters, cap) of the text known when last computed
        self.stopped = False

    def _refresh(self) -> None:
        if self._known[0] != len(self.track.text):
            self._known = (len(self.track.text), runaway_frames(self.track.text, self.language))

    def ready(self, n: int) -> bool:
        """Whether ``self(n)`` would answer without waiting (pulls what a ``TextFeed`` holds)."""
        self.track.poll()
        self._refresh()
        return self._known[1] > n or self.track.closed

    def __call__(self, n: int) -> bool:
        """Whether the utterance may hold no more than ``n`` frames."""
        while True:
            self._refresh()
            if self._known[1] > n:
                return False
            if self.track.closed:
                self.stopped = True
                return True
            self.track.pull()


def as_prepared(tts: "TTS", text, voice: Voice | None, options: dict) -> PreparedSpeech:
    """``text`` itself when it is a ``PreparedSpeech`` of ``tts`` (then no voice or options), else one of a request
    (``SynthesisRequest.make``)."""
    if isinstance(text, PreparedSpeech):
        if voice is not None or options:
            raise KzttsError("give a prepared request alone, or text, voice and options, not both")
        if text.tts is not tts:
            raise KzttsError("this request was prepared by another TTS; prepare it with this one")
        return text
    return PreparedSpeech(tts, SynthesisRequest.make(text, voice, options))
