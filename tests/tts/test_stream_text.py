"""``TTS.stream_text``: speech from a text while it is written (``kztts.tts.text.track``).

Whatever way the text is cut and however slowly it comes, the committed tokens equal the whole text's
and the codes and samples equal ``synthesize(whole_text, streaming_text=True)`` (whose codes
tests/tts/test_tts.py and test_model_kinds.py check against qwen-tts's streaming mode), greedy and sampled,
for every kind: Base with an x-vector and with an ICL voice, CustomVoice with and without an instruction,
VoiceDesign. Bad sources fail in one line, after the audio of the frames they allowed.
"""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from kztts import TTS, SynthesisRequest
from kztts.core.errors import KzttsError
from kztts.tts.text.track import TextSourceError, TextTrack

SHORT = "Hi, it's 9 o'clock!"  # every character boundary of it is a cut below
TEXTS = [SHORT, "Hello world, this is a tiny test.", "  Leading spaces\nand a newline;  two  spaces.",
         "你好，世界！今天是2024年1月1日。", "Don't, won't, I'll we've: 3.14159 -42 1,000,000...",
         "MixedCASE iPhone HTTPServer e\u0301te\u0301 naïve café", "Tabs\tand\r\nCRLF\n\n\nend ?!"]
FRAMES = 12  # per utterance in the cut sweeps: the text's tokens are read by then


def every_boundary(text: str) -> list[list[str]]:
    """The text cut in two at each character boundary, and into its characters."""
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


def random_cuts(text: str, rng: random.Random, n: int) -> list[list[str]]:
    out = []
    for _ in range(n):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(8, len(text) - 1))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return out


@pytest.fixture(scope="module")
def tts(equal_bundle):
    return TTS(equal_bundle)


@pytest.fixture(scope="module")
def xvector(tts):
    from kztts.core.audio import synthetic_voice

    return tts.voice_from_wav(synthetic_voice(), 24000)


@pytest.fixture(scope="module")
def icl(tts):
    from kztts.core.audio import synthetic_voice

    return tts.voice_from_reference(synthetic_voice(), 24000, "A short reference sentence.")


def spoken(tts: TTS, pieces, request: SynthesisRequest, **kw):
    """(codes, samples) of ``stream_text(pieces)`` for ``request``'s voice and options."""
    holder: dict = {}
    opts = {k: getattr(request, k) for k in ("language", "seed", "greedy", "settings", "max_frames", "speaker",
                                             "instruct")}
    chunks = list(tts.stream_text(pieces, request.voice, result=holder, **opts, **kw))
    return holder["result"].codes, np.concatenate(chunks)


def whole(tts: TTS, request: SynthesisRequest):
    """(codes, samples) of ``stream`` of the whole text in the streaming text mode (``synthesize``'s codes)."""
    holder: dict = {}
    chunks = list(tts.stream(SynthesisRequest(**{**request.__dict__, "streaming_text": True}), result=holder))
    return holder["result"].codes, np.concatenate(chunks)


# ------------------------------------------------------------------ tokens
@pytest.mark.parametrize("text", TEXTS)
def test_committed_tokens_equal_the_whole_text_s_however_it_is_cut(tts, text):
    want = list(tts.tokenizer.assistant_ids(text)[3:-5])
    for pieces in every_boundary(text) + random_cuts(text, random.Random(0), 30):
        track = TextTrack(tts.tokenizer, pieces)
        seen = []
        while not track.closed:
            track.pull()
            assert track.tokens == want[:len(track.tokens)], (pieces, track.text)
            seen.append(len(track.tokens))
        assert track.tokens == want, pieces
        assert track.role == list(tts.tokenizer.assistant_ids(text)[:3])


def test_a_token_is_committed_once_the_next_word_starts(tts):
    track = TextTrack(tts.tokenizer, ["Hello", " wor", "ld", ", again"])
    track.pull()
    assert track.tokens == []  # "Hello" may still grow
    track.pull()
    assert len(track.tokens) == 1  # " wor" started: "Hello" is final
    track.pull()
    assert len(track.tokens) == 1
    track.pull()
    assert len(track.tokens) == 3  # "Hello", " world", ",": " again" may still grow


# ------------------------------------------------------------------ exact codes and samples, every kind
def test_every_cut_of_a_short_text_gives_the_whole_text_s_codes_and_samples(tts, xvector):
    request = SynthesisRequest(SHORT, xvector, language="english", greedy=True, max_frames=FRAMES)
    codes, samples = whole(tts, request)
    for pieces in every_boundary(SHORT):
        got_codes, got_samples = spoken(tts, pieces, request)
        assert np.array_equal(got_codes, codes), pieces
        assert np.array_equal(got_samples, samples), pieces


@pytest.mark.parametrize("who", ["xvector", "icl"])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_base_voices_random_cuts_at_the_runaway_cap(tts, xvector, icl, who, greedy):
    """No max_frames: the random model never stops, so the cap from the whole text's expected duration (decided as
    the text arrives) ends the speech, as it ends ``synthesize``'s."""
    voice = xvector if who == "xvector" else icl
    text = TEXTS[1]
    request = SynthesisRequest(text, voice, language="english", greedy=greedy, seed=7)
    codes, samples = whole(tts, request)
    assert len(codes) > 2 * len(tts.tokenizer.assistant_ids(text))  # the whole text read, then more frames
    for pieces in random_cuts(text, random.Random(1), 4) + [[text]]:
        got_codes, got_samples = spoken(tts, pieces, request)
        assert np.array_equal(got_codes, codes), pieces
        assert np.array_equal(got_samples, samples), pieces


@pytest.mark.parametrize("name,request_kw", [
    ("custom_voice", dict(speaker="Ryan", language="English")),
    ("custom_voice", dict(speaker="aiden", language="English", instruct="Very happy.")),
    ("custom_voice_06", dict(speaker="dylan", language="Auto")),
    ("voice_design", dict(language="English", instruct="A deep, calm male voice.")),
    ("voice_design", dict(language="Chinese", instruct="")),
], ids=["cv-speaker", "cv-instruct", "cv06-dialect", "vd-instruct", "vd-no-instruct"])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_other_kinds_random_cuts(custom_voice_bundle, custom_voice_06_bundle, voice_design_bundle, name, request_kw,
                                 greedy):
    bundle = {"custom_voice": custom_voice_bundle, "custom_voice_06": custom_voice_06_bundle,
              "voice_design": voice_design_bundle}[name]
    tts = TTS(bundle)
    text = TEXTS[3] if request_kw["language"] in ("Chinese", "Auto") else TEXTS[1]
    request = SynthesisRequest(text, greedy=greedy, seed=3, max_frames=24, **request_kw)
    codes, samples = whole(tts, request)
    for pieces in random_cuts(text, random.Random(2), 3) + [list(text)]:
        got_codes, got_samples = spoken(tts, pieces, request)
        assert np.array_equal(got_codes, codes), pieces
        assert np.array_equal(got_samples, samples), pieces


def test_a_slow_source_changes_no_code_and_the_frames_wait(tts, xvector):
    """The Talker runs ahead of a source that gives a word every 30 ms: frames wait for their token (counted), the
    codes do not change; the pipelined decoder gives the same samples."""
    text = TEXTS[1]
    request = SynthesisRequest(text, xvector, language="english", greedy=True, max_frames=20)
    codes, samples = whole(tts, request)

    def slow():
        for word in text.split(" "):
            time.sleep(0.03)
            yield word if word == text.split(" ")[0] else " " + word

    holder: dict = {}
    got = np.concatenate(list(tts.stream_text(slow(), xvector, language="english", greedy=True, max_frames=20,
                                              result=holder, pipeline=True)))
    assert np.array_equal(holder["result"].codes, codes)
    np.testing.assert_array_equal(got, samples)


def test_the_prefill_runs_on_a_guessed_first_token_while_the_text_comes(tts, xvector, monkeypatch):
    """The first prefill runs once some text has come, on its first token as guessed, before the piece that
    commits it is read; a wrong guess (the first word went on) is prefilled again on the committed token. The
    codes are the whole text's either way."""
    from kztts.tts.prompt import TrackPrompt

    events: list = []
    talker_type = type(tts.talker)
    prefill, confirm = talker_type.prefill, TrackPrompt.confirm

    def logged_prefill(self, embeds):
        events.append("prefill")
        return prefill(self, embeds)

    def logged_confirm(self):
        events.append(("confirmed", ok := confirm(self)))
        return ok

    monkeypatch.setattr(talker_type, "prefill", logged_prefill)
    monkeypatch.setattr(TrackPrompt, "confirm", logged_confirm)

    def source(pieces):
        for piece in pieces:
            events.append(piece)
            yield piece

    text = "Hello there, my friend."
    request = SynthesisRequest(text, xvector, language="english", greedy=True, max_frames=8)
    codes, _ = whole(tts, request)
    for pieces, order in ((["Hello", " there, my friend."], ["Hello", "prefill", " there, my friend.",
                                                               ("confirmed", True)]),
                          (["Hel", "lo there, my friend."], ["Hel", "prefill", "lo there, my friend.",
                                                             ("confirmed", False), "prefill", ("confirmed", True)])):
        events.clear()
        got, _ = spoken(tts, source(pieces), request)
        assert events[:len(order)] == order, events
        assert np.array_equal(got, codes), pieces


def test_a_text_cut_by_its_expected_duration_says_so(tts, xvector, caplog):
    """With no max_frames, a random-weight model runs to the cap of the text's expected duration (it seldom stops);
    the result names that cap as what cut it, as synthesize's does, and the log says it once."""
    import logging

    text = "Hi there."
    holder: dict = {}
    with caplog.at_level(logging.INFO, logger="kztts.tts.utterance"):
        list(tts.stream_text(["Hi", " there."], xvector, language="english", greedy=True, result=holder))
    got = holder["result"]
    want = tts.synthesize(text, xvector, language="english", greedy=True, streaming_text=True)
    assert np.array_equal(got.codes, want.codes) and not got.stopped_by_eos
    assert len(got.limits) == 1 and f"stopped at {got.frames} frames" in got.limits[0], got.limits
    assert got.limits == want.limits
    assert [r.getMessage() for r in caplog.records] == got.limits


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("pieces", [[], [""], ["  ", "\n"]], ids=["none", "empty", "blank"])
def test_empty_text_is_one_clear_error_before_any_audio(tts, xvector, pieces):
    with pytest.raises(KzttsError, match="the text is empty"):
        next(tts.stream_text(pieces, xvector))


@pytest.mark.parametrize("pieces,match", [("a whole string", "iterable of pieces"), (5, "iterable of strings"),
                                          (["ok", 3], "text piece 2 must be a string")])
def test_bad_pieces_are_refused(tts, xvector, pieces, match):
    with pytest.raises(KzttsError, match=match):
        list(tts.stream_text(pieces, xvector, max_frames=30))


def test_the_other_text_mode_is_refused(tts, xvector):
    with pytest.raises(KzttsError, match="streaming text mode"):
        next(tts.stream_text(["Hi."], xvector, streaming_text=False))


@pytest.mark.parametrize("pipeline", [False, True], ids=["in-loop", "pipelined"])
def test_a_source_that_fails_mid_utterance_delivers_the_audio_so_far_then_one_error(tts, xvector, pipeline):
    text = TEXTS[1]
    n_ok = 5  # pieces before the failure

    def failing():
        for i, ch in enumerate(text.split(" ")):
            if i == n_ok:
                raise ConnectionError("the LM went away")
            yield ch if i == 0 else " " + ch

    chunks = []
    with pytest.raises(TextSourceError, match="the LM went away") as err:
        for chunk in tts.stream_text(failing(), xvector, language="english", greedy=True, pipeline=pipeline):
            chunks.append(chunk)
    assert "text source failed" in str(err.value)
    # every frame made before the failure was decoded and delivered: as many as the text known allowed
    track = TextTrack(tts.tokenizer, [" ".join(text.split(" ")[:n_ok])])
    track.pull()  # the text that came, its last word not committed: frame k took in token k
    assert sum(c.shape[0] for c in chunks) == len(track.tokens) * 1920 > 0
    # the TTS serves the next call
    assert len(list(tts.stream_text(["Fine."], xvector, max_frames=3))) >= 1


def test_a_source_on_another_thread_queue(tts, xvector):
    """A queue fed by another thread (as a server or an LM thread feeds it) works as a source."""
    import queue

    q: queue.Queue = queue.Queue()
    text = "Queue fed, word by word."

    def feed():
        for w in text.split(" "):
            q.put(w if w == text.split(" ")[0] else " " + w)
            time.sleep(0.01)
        q.put(None)

    threading.Thread(target=feed, daemon=True).start()
    pieces = iter(q.get, None)
    request = SynthesisRequest(text, xvector, language="english", greedy=True, max_frames=16)
    codes, _ = whole(tts, request)
    got, _ = spoken(tts, pieces, request)
    assert np.array_equal(got, codes)


# ------------------------------------------------------------------ the protocol: checked and tokenized once
@pytest.mark.parametrize("how", ["synthesize", "stream", "batch"])
def test_a_request_is_checked_and_its_text_tokenized_once(tts, xvector, monkeypatch, how):
    """Every way of speaking drives one ``PreparedSpeech``: the kind's check and the text's tokenization run once."""
    from kztts.tts.model_kind import ModelKind

    checks, encodes = [], []
    check, encode = ModelKind.check, tts.tokenizer.encode
    monkeypatch.setattr(ModelKind, "check", lambda self, r: (checks.append(r), check(self, r))[1])
    monkeypatch.setattr(tts.tokenizer, "encode", lambda s: (encodes.append(s), encode(s))[1])
    request = SynthesisRequest("Once, only once.", xvector, language="english", greedy=True, max_frames=3)
    if how == "synthesize":
        tts.synthesize(request)
    elif how == "stream":
        list(tts.stream(request))
    else:
        tts.synthesize_many([request])
    assert len(checks) == 1
    assert [s for s in encodes if "Once, only once." in s] == ["<|im_start|>assistant\nOnce, only once.<|im_end|>\n"
                                                             "<|im_start|>assistant\n"]


# ------------------------------------------------------------------ a long text
LONG = ("The first sentence is short. A second one follows it, somewhat longer than the first. Then a third! "
        "And a fourth, which asks a question? The fifth sentence has no end but a comma, then goes on and on "
        "without any stop at all for a good many words until it must be cut somewhere; the sixth closes it.")


@pytest.fixture(scope="module")
def small(equal_bundle):
    """A Talker context of 64 positions: a piece holds a dozen text tokens."""
    return TTS(equal_bundle, context=64)


def test_written_cuts_equal_the_whole_text_s_however_the_text_arrives(small):
    from kztts.tts.text.tokenizer import assistant_text
    from kztts.tts.text.split import split_written, written_cut, written_safe

    tok = small.tokenizer

    def count(s):
        return len(tok.text_body(tok.encode(assistant_text(s)))) if s else 0

    for limit in (6, 11, 25):
        want = split_written(LONG, limit, count)
        assert len(want) > 1 and "".join(w.replace(" ", "") for w in want) == LONG.replace(" ", "")
        assert all(count(w.strip()) <= limit for w in want)
        assert all(count(w.strip()) >= (limit + 1) // 2 for w in want[:-1])
        for n in range(1, len(LONG) + 1, 7):  # a prefix: a cut it gives is final, and never before the safe point
            start = 0
            for piece in want:
                cut = written_cut(LONG[:n], start, n == len(LONG), limit, count)
                if cut is None:
                    assert written_safe(LONG[:n], start, limit, count) <= start + len(piece)
                    break
                assert LONG[start:cut[0]] == piece
                start = cut[1]


SHORTER = ("The first sentence is short. A second one follows it, longer than the first. The third runs on "
           "without any stop for a good many words until it must be cut; done.")


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_a_long_text_is_cut_where_synthesize_cuts_it(small, greedy):
    """Pieces at sentence ends and, in a run-on sentence, at a clause or word end, each spoken as synthesize speaks
    it, joined as it joins them."""
    from kztts.core.audio import synthetic_voice

    voice = small.voice_from_wav(synthetic_voice(), 24000)
    # no max_frames: a piece's frames are capped by the context (or its runaway cap), so the text is cut
    request = SynthesisRequest(SHORTER, voice, language="english", greedy=greedy, seed=5)
    pieces = small.pieces(SynthesisRequest(**{**request.__dict__, "streaming_text": True}))
    assert len(pieces) >= 3 and any(not p.rstrip().endswith((".", "!", "?")) for p in pieces[:-1])
    codes, samples = whole(small, request)
    words = SHORTER.split(" ")
    cuts = [[words[0]] + [" " + w for w in words[1:]]] + (random_cuts(SHORTER, random.Random(4), 1) if greedy else [])
    for cut in cuts:
        holder: dict = {}
        got = np.concatenate(list(small.stream_text(cut, voice, language="english", greedy=greedy, seed=5,
                                                    result=holder)))
        assert np.array_equal(holder["result"].codes, codes)
        assert len(holder["result"].pieces) == len(pieces)
        assert [p.text for p in holder["result"].pieces] == pieces
        np.testing.assert_array_equal(got, samples)
