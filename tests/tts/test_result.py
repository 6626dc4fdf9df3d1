"""kztts.tts.utterance: ``Utterance``, one utterance in progress, says what cut it short (the context, the runaway cap or
``max_frames``, never the asked-for length) and becomes a ``SynthesisResult``; ``joined`` makes one result of a
long text's pieces (codes in order, stage times summed); a result's summary (through synthesis:
tests/tts/test_long_text.py, test_tts.py)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from kztts.tts.duration import expected_seconds
from kztts.tts.frame_loop import StageTimes
from kztts.tts.result import Piece, SynthesisResult, joined
from kztts.tts.utterance import Utterance

TEXT = "A sentence long enough to be cut in the message, and more."


def run(frames: int, *, max_frames: int = 10, min_new: int = 2, eos: bool = False, limited_by: str = "max_frames",
        guard=None, label: str = "the text", random_weights: bool = False) -> Utterance:
    talker = SimpleNamespace(context=64, **({} if guard is None else {"guard": guard}))
    loop = SimpleNamespace(settings=SimpleNamespace(max_frames=max_frames, min_new_tokens=min_new),
                           stopped_by_eos=eos, talker=talker, times=StageTimes(talker=0.5), capped=None)
    r = Utterance(loop, SimpleNamespace(embeds=np.zeros((12, 4))), SimpleNamespace(text=TEXT, language="english",
                                                                             voice="v"),
            time.perf_counter(), limited_by, label, random_weights=random_weights)
    r.codes = [np.full(16, k, np.int64) for k in range(frames)]
    return r


def test_what_cut_an_utterance_short():
    assert run(10, eos=True).limit() is None  # its end of speech
    assert run(7).limit() is None  # stopped before its cap: by EOS
    assert run(2, max_frames=2, min_new=2).limit() is None  # EOS blocked for all of it: the length asked for
    head = f"the text ({TEXT[:40]!r}...)"
    assert run(10).limit() == f"{head} stopped at max_frames=10 before its end of speech"
    assert run(10, limited_by="context", label="piece 2/3").limit() == (
        f"piece 2/3 ({TEXT[:40]!r}...) stopped at 10 frames before its end of speech: the Talker's context of 64 "
        "positions holds its 12-position prompt and no more frames; the rest of its text may be unspoken")
    message = run(10, limited_by="expected duration").limit()
    assert message.startswith(f"{head} stopped at 10 frames (0.8 s of audio; its text is expected to take "
                              f"{expected_seconds(TEXT, 'english'):.1f} s)")
    assert message.endswith("give max_frames (--max-frames) to allow more")
    # a random-weight model seldom stops: the cap is said plainly, with no advice that more frames would help
    random = run(10, limited_by="expected duration", random_weights=True).limit()
    assert random == (f"{head} stopped at 10 frames (0.8 s of audio), the cap of a model that does not stop by "
                      f"itself: 3x the text's expected {expected_seconds(TEXT, 'english'):.1f} s, at least 3 s; "
                      "a random-weight model seldom ends its speech by itself")


def test_a_run_becomes_a_result():
    r = run(10, guard=SimpleNamespace(count=3))
    assert r.voice == "v" and r.text == TEXT and r.code_array().shape == (10, 16)
    result = r.result(np.ones(1920 * 10, np.float64), 24000)
    assert result.samples.dtype == np.float32 and result.frames == 10 and result.audio_seconds == 0.8
    assert result.pieces == [Piece(TEXT, 10, False, r.limit())] and result.limits == [r.limit()]
    assert result.fp16_saturations == 3 and not result.stopped_by_eos
    empty = run(0, eos=True).result(np.zeros(0, np.float32), 24000)
    assert empty.frames == 0 and empty.real_time_factor == float("inf") and empty.fp16_saturations is None


def test_pieces_join_into_one_result():
    a = run(4, eos=True).result(np.zeros(4 * 1920, np.float32), 24000)
    b = run(10, guard=SimpleNamespace(count=2)).result(np.zeros(10 * 1920, np.float32), 24000)
    whole = joined([a, b], np.zeros(14 * 1920 + 100, np.float32), 24000, time.perf_counter() - 2.0, first_audio=0.1)
    assert np.array_equal(whole.codes, np.concatenate([a.codes, b.codes]))
    assert whole.pieces == a.pieces + b.pieces and not whole.stopped_by_eos and whole.limits == b.limits
    assert whole.times.talker == pytest.approx(1.0) and whole.times.first_audio == 0.1
    assert whole.fp16_saturations == 2 and whole.total_seconds >= 2.0
    summary = whole.summary()
    assert (summary["frames"], summary["pieces"], summary["truncated"], summary["limits"]) == (14, 2, True, b.limits)
    assert summary["fp16_saturations"] == 2 and summary["ms"]["talker"] == 1000.0
    plain = SynthesisResult(np.zeros(24000, np.float32), 24000, np.zeros((12, 16), np.int64), StageTimes(), 0.5, True)
    assert "fp16_saturations" not in plain.summary() and plain.summary()["real_time_factor"] == 0.5
