"""The talker prompt (prefill embeddings + trailing text), exactly as qwen-tts's
``Qwen3TTSForConditionalGeneration.generate`` / ``generate_icl_prompt`` build it.

numpy only. Notation: T(ids) projected text embedding,
C(ids) talker codec embedding, ``input_ids`` the assistant template ids
``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``.

    instruct T(instruct_ids)  (``<|im_start|>user\n{instruct}<|im_end|>\n``, only with an instruction)
    role     T(ids[:3])                                                  3 positions
    prefix   (tts_pad x (n-2), tts_bos) + C(codec_prefix[:-1])           n-1 positions
             codec_prefix = [think, think_bos, lang, think_eos] | [nothink, think_bos, think_eos],
                            then the speaker vector (if any), then [pad, bos]
             a dialect speaker (CustomVoice) replaces lang by its dialect's id for Chinese or auto
    text     x-vector streaming:      T(ids[3]) + C(bos);   trailing [T(ids[4:-5]), tts_eos]
             x-vector non-streaming:  [T(ids[3:-5]), tts_eos] + C(pad), tts_pad + C(bos);
                                      trailing [tts_pad]
             ICL (ref text r = ref_ids[3:-2], ref codes R [F, 16]):
               text  = [T(r ++ ids[3:-5]), tts_eos]   codec = [C(bos), codec_sum(R)]
               non-streaming: [text + C(pad)] ++ [codec + tts_pad]; trailing [tts_pad]
               streaming: text + codec over min length; leftover text is trailing, or if
                          the text is not longer, text padded with tts_pad and trailing [tts_pad]

The decode loop adds ``trailing[k]`` to the k-th generated frame's input while k < K,
then ``tts_pad``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from kztts.bundle.embeddings import EmbeddingTables
from kztts.core.errors import KzttsError

if TYPE_CHECKING:
    from kztts.tts.text.track import DualTrack

MODES = ("xvector", "icl")


@dataclass
class Prompt:
    embeds: np.ndarray  # f32 [T, H] prefill
    trailing: np.ndarray  # f32 [K, H] added to decode inputs 0..K-1
    tts_pad: np.ndarray  # f32 [H] added to decode inputs from K on
    voice_positions: int = 0  # leading positions that depend on the voice and language only (role + prefix)

    def text_after(self, step: int) -> np.ndarray:
        """The text row added to the decode input that follows frame ``step``."""
        return self.trailing[step] if step < len(self.trailing) else self.tts_pad

    def confirm(self) -> bool:
        """Whether the prefill just run on ``embeds`` stands (a whole text's prompt: always)."""
        return True


def supported_languages(languages: dict) -> list[str]:
    """Names a user may pass, like qwen-tts's Base wrapper: "auto" + the non-dialect languages."""
    return ["auto"] + sorted(k for k in languages if "dialect" not in k)


def language_id(languages: dict, language: str | None) -> int | None:
    """Codec id of ``language`` (case-insensitive), None for "auto"/None (no language tag)."""
    if language is None or str(language).lower() == "auto":
        return None
    name = str(language).lower()
    if name not in languages or "dialect" in name:
        raise KzttsError(f"unknown language {language!r}; known: {', '.join(supported_languages(languages))}")
    return int(languages[name])


def speaker_language_id(languages: dict, language: str | None, dialect: str | None) -> int | None:
    """``language_id``, as qwen-tts remaps it for a dialect speaker: Chinese or auto become the dialect's id."""
    lid = language_id(languages, language)
    if dialect and (language is None or str(language).lower() in ("auto", "chinese")):
        return int(languages[dialect])
    return lid


def prompt_length(text_tokens: int, *, language: bool, speaker: bool, mode: str, non_streaming: bool,
                  ref_text_tokens: int = 0, ref_frames: int = 0, instruct_tokens: int = 0) -> int:
    """Positions of ``build_prompt``'s prefill for ``text_tokens`` text tokens (``ids[3:-5]``), without
    building it: the layout in the module docstring (``tests/tts/test_long_text.py`` checks the two agree)."""
    n = (4 if language else 3) + (1 if speaker else 0) + 2  # codec prefix: tags, speaker, pad/bos
    head = instruct_tokens + 3 + n - 1  # instruction + role + prefix
    if mode == "icl":
        text, codec = ref_text_tokens + text_tokens + 1, 1 + ref_frames
        return head + (text + codec if non_streaming else codec)
    return head + (text_tokens + 2 if non_streaming else 1)


def _ids_1d(ids, what: str) -> np.ndarray:
    a = np.asarray(ids)
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise KzttsError(f"{what} must be a 1-D array of token ids, got {a.dtype}{list(a.shape)}")
    return a.astype(np.int64)


def _codec_prefix(tables: EmbeddingTables, sid: dict, language_id: int | None,
                  speaker: np.ndarray | None) -> np.ndarray:
    """C(language tags), the speaker vector, C(pad, bos): [n, H]."""
    H = tables.hidden
    if language_id is None:
        tags = [sid["codec_nothink"], sid["codec_think_bos"], sid["codec_think_eos"]]
    else:
        tags = [sid["codec_think"], sid["codec_think_bos"], int(language_id), sid["codec_think_eos"]]
    parts = [tables.codec(tags)]
    if speaker is not None:
        spk = np.asarray(speaker, dtype=np.float32)
        if spk.size != H or spk.ndim not in (1, 2):
            raise KzttsError(f"speaker vector has shape {list(np.shape(speaker))}; this model expects "
                             f"{H} values (the talker hidden size)")
        if not np.all(np.isfinite(spk)):
            raise KzttsError("speaker vector contains NaN or inf")
        parts.append(spk.reshape(1, H))
    parts.append(tables.codec([sid["codec_pad"], sid["codec_bos"]]))
    return np.concatenate(parts, axis=0)


def _icl_text(tables: EmbeddingTables, sid: dict, ids: np.ndarray, ref_text_ids, ref_codes,
              non_streaming: bool) -> tuple[list[np.ndarray], np.ndarray]:
    """The text positions and trailing text of an ICL voice clone (module docstring)."""
    tts_eos, tts_pad = tables.tts_eos, tables.tts_pad
    if ref_text_ids is None or ref_codes is None:
        raise KzttsError("ICL voice cloning needs the reference text ids and the reference codes")
    r = _ids_1d(ref_text_ids, "ref_text_ids")
    if len(r) < 6:
        raise KzttsError("the reference text is empty: ICL needs at least one reference text token")
    codes = np.asarray(ref_codes)
    if codes.ndim != 2 or codes.shape[1] != tables.num_cp_groups + 1 or codes.shape[0] == 0:
        raise KzttsError(f"reference codes must be [frames > 0, {tables.num_cp_groups + 1}], "
                         f"got {list(codes.shape)}")
    text = np.concatenate([tables.text(np.concatenate([r[3:-2], ids[3:-5]])), tts_eos[None]], axis=0)
    codec = np.concatenate([tables.codec([sid["codec_bos"]]), tables.codec_sum(codes)], axis=0)
    if non_streaming:
        pad = tables.codec([sid["codec_pad"]])
        return [text + pad, codec + tts_pad], tts_pad[None]
    nt, nc = len(text), len(codec)
    if nt > nc:
        return [text[:nc] + codec], text[nc:]
    padded = np.concatenate([text, np.broadcast_to(tts_pad, (nc - nt, tables.hidden))], axis=0)
    return [padded + codec], tts_pad[None]


def _xvector_text(tables: EmbeddingTables, sid: dict, ids: np.ndarray, c_bos: np.ndarray,
                  non_streaming: bool) -> tuple[list[np.ndarray], np.ndarray]:
    """The text positions and trailing text of an x-vector voice (module docstring)."""
    tts_eos, tts_pad = tables.tts_eos, tables.tts_pad
    if non_streaming:
        body = tables.text(ids[3:-5])
        pad = tables.codec([sid["codec_pad"]])
        return [np.concatenate([body, tts_eos[None]], axis=0) + pad, (tts_pad + c_bos[0])[None]], tts_pad[None]
    return [tables.text(ids[3:4]) + c_bos], np.concatenate([tables.text(ids[4:-5]), tts_eos[None]], axis=0)


def _head(tables: EmbeddingTables, ids: np.ndarray, sid: dict, language_id: int | None, speaker: np.ndarray | None,
          instruct_ids) -> tuple[list[np.ndarray], np.ndarray]:
    """The prompt's positions before the text (instruction, role, codec prefix) and the codec prefix."""
    H = tables.hidden
    codec_prefix = _codec_prefix(tables, sid, language_id, speaker)  # [n, H]
    n = codec_prefix.shape[0]
    text_side = np.concatenate([np.broadcast_to(tables.tts_pad, (n - 2, H)), tables.tts_bos[None]], axis=0)
    embeds = [tables.text(ids[:3]), text_side + codec_prefix[:-1]]  # role, then the prefix
    if instruct_ids is not None:
        embeds.insert(0, tables.text(_ids_1d(instruct_ids, "instruct_ids")))
    return embeds, codec_prefix


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise KzttsError(f"unknown prompt mode {mode!r}; expected one of {MODES}")


def build_prompt(tables: EmbeddingTables, input_ids, *, special_ids: dict, language_id: int | None,
                 speaker: np.ndarray | None, mode: str, non_streaming: bool,
                 ref_text_ids=None, ref_codes=None, instruct_ids=None) -> Prompt:
    """The talker prompt for one utterance.

    ``input_ids``: assistant template ids (``TextTokenizer.assistant_ids``); ``special_ids``:
    the manifest's; ``language_id``: a codec id or None (auto); ``speaker``: the x-vector
    [H] or a preset speaker's codec row (None leaves the speaker position out); ``mode``: "xvector" or "icl"
    (then ``ref_text_ids`` = ``TextTokenizer.ref_ids(ref_text)`` and ``ref_codes`` [F, 16] are needed);
    ``instruct_ids``: ``TextTokenizer.instruct_ids(instruct)``, or None for no instruction.
    """
    _check_mode(mode)
    ids = _ids_1d(input_ids, "input_ids")
    if len(ids) < 9:
        raise KzttsError("the text is empty: the prompt needs at least one text token "
                         f"(got {len(ids)} template ids)")
    sid = {k: int(v) for k, v in special_ids.items()}
    embeds, codec_prefix = _head(tables, ids, sid, language_id, speaker, instruct_ids)
    if mode == "icl":
        text, trailing = _icl_text(tables, sid, ids, ref_text_ids, ref_codes, non_streaming)
    else:
        text, trailing = _xvector_text(tables, sid, ids, codec_prefix[-1:], non_streaming)
    embeds += text
    return Prompt(embeds=np.ascontiguousarray(np.concatenate(embeds, axis=0), dtype=np.float32),
                  trailing=np.ascontiguousarray(trailing, dtype=np.float32),
                  tts_pad=np.array(tables.tts_pad, dtype=np.float32), voice_positions=3 + codec_prefix.shape[0] - 1)


@dataclass
class TrackPrompt(Prompt):
    """The streaming text mode's prompt for a text still arriving (``kztts.tts.text.track``): its prefill
    holds the text rows it needs, and ``text_after(step)`` takes the next row of the track, waiting for
    the text it needs. Equal, row for row, to ``build_prompt(..., non_streaming=False)`` of the whole text.

    Built with ``guess=True`` before its first text token is committed, it holds that token as guessed from the
    text so far (``TextTrack.first_guess``), so the prefill runs while the text that commits it is still on its
    way; ``confirm()`` then waits for the committed token and tells whether the prefill stands (the very rows
    committed), else rebuilds ``embeds`` from them for a second prefill. Either way the prefill that counts ran
    on the committed prompt, so the codes are those of a prompt built after the commit."""

    track: "DualTrack | None" = None
    first_row: int = 0  # the track row added to the input after frame 0
    rebuild: "Callable[[], TrackPrompt] | None" = None  # the prompt from the committed rows (guessed: not None)
    guessed_role: "list[int] | None" = None
    codec_bos: "np.ndarray | None" = None  # C(codec_bos), added to the first text row
    guesses: int = 0  # prefills run on a guess that the committed text did not confirm

    def text_after(self, step: int) -> np.ndarray:
        return self.track.row(self.first_row + step)

    def confirm(self) -> bool:
        if self.rebuild is None:
            return True
        rebuild, self.rebuild = self.rebuild, None
        track = self.track.track
        track.need(1)
        if not track.tokens:
            track.read_all()  # an empty text is refused here
        if track.role == self.guessed_role:  # the same head: only the text row may differ
            last = (self.track.row(0)[None] + self.codec_bos)[0]
            if np.array_equal(last, self.embeds[-1]):
                return True
            self.embeds = self.embeds.copy()
            self.embeds[-1] = last
        else:
            committed = rebuild()
            self.embeds, self.voice_positions = committed.embeds, committed.voice_positions
        self.guesses += 1
        return False


def build_track_prompt(tables: EmbeddingTables, track: "DualTrack", *, special_ids: dict, language_id: int | None,
                       speaker: np.ndarray | None, mode: str, ref_codes=None, instruct_ids=None,
                       guess: bool = False) -> TrackPrompt:
    """``build_prompt`` in the streaming text mode for a text still arriving: waits for the text rows the
    prefill holds (x-vector: the first token; ICL: as many rows as the reference has codec positions, or
    the end of a shorter text). ``track``'s ``ref`` holds an ICL voice's reference text tokens. ``guess``: an
    x-vector prompt waits only for some text and guesses its first token (``TrackPrompt``; run its prefill,
    then ``confirm()``)."""
    _check_mode(mode)
    sid = {k: int(v) for k, v in special_ids.items()}
    guessed = track.track.first_guess() if guess and mode != "icl" else None
    if guessed is None:
        track.track.need(1)  # the role's ids are known with the first text token
        if not track.track.tokens:
            track.track.read_all()  # an empty text is refused here, in one line
    ids = np.asarray(track.track.role if guessed is None else guessed[0], dtype=np.int64)
    embeds, codec_prefix = _head(tables, ids, sid, language_id, speaker, instruct_ids)
    if mode == "icl":
        codes = np.asarray(ref_codes) if ref_codes is not None else None
        if codes is None or codes.ndim != 2 or codes.shape[1] != tables.num_cp_groups + 1 or codes.shape[0] == 0:
            raise KzttsError(f"reference codes must be [frames > 0, {tables.num_cp_groups + 1}], "
                             f"got {None if codes is None else list(codes.shape)}")
        if len(track.ref) == 0:
            raise KzttsError("the reference text is empty: ICL needs at least one reference text token")
        codec = np.concatenate([tables.codec([sid["codec_bos"]]), tables.codec_sum(codes)], axis=0)
        embeds.append(track.rows(len(codec)) + codec)
        first = len(codec)
    else:
        row = track.row(0) if guessed is None else tables.text([guessed[1]])[0]
        embeds.append(row[None] + codec_prefix[-1:])
        first = 1
    rebuild = None
    if guessed is not None:
        def rebuild() -> TrackPrompt:
            return build_track_prompt(tables, track, special_ids=special_ids, language_id=language_id,
                                      speaker=speaker, mode=mode, instruct_ids=instruct_ids)
    return TrackPrompt(embeds=np.ascontiguousarray(np.concatenate(embeds, axis=0), dtype=np.float32),
                       trailing=np.zeros((0, tables.hidden), np.float32),
                       tts_pad=np.array(tables.tts_pad, dtype=np.float32),
                       voice_positions=3 + codec_prefix.shape[0] - 1, track=track, first_row=first, rebuild=rebuild,
                       guessed_role=None if guessed is None else list(guessed[0]), codec_bos=codec_prefix[-1:])
