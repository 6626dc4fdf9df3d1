"""kztts.eval.replay: the teacher-forced Talker and the greedy CB0 of validation and calibration."""
from __future__ import annotations

import numpy as np

from kztts.eval.replay import decode_inputs, greedy_cb0, teacher_forced_talker
from kztts.tts.prompt import Prompt

H, V = 4, 2048 + 1024
EOS = V - 1024 + 2


class _Tables:
    hidden = H

    def codec_sum(self, frame):
        return np.full(H, float(np.sum(frame)), np.float32)


class _EchoTalker:
    """Logits and hidden that say what was fed: the number of positions and the last input."""

    def __init__(self):
        self.fed = []

    def prefill(self, embeds):
        self.fed.append(np.asarray(embeds))
        return np.full(V, len(embeds), np.float32), np.asarray(embeds[-1])

    def decode(self, e):
        self.fed.append(np.asarray(e))
        return np.full(V, -1.0, np.float32), np.asarray(e)


def test_decode_inputs_add_trailing_text_then_tts_pad():
    prompt = Prompt(np.zeros((1, H), np.float32), np.array([[10.0] * H, [20.0] * H], np.float32),
                    np.full(H, 0.5, np.float32))
    codes = np.ones((4, 16), np.int64)
    got = decode_inputs(_Tables(), prompt, codes)
    assert got.dtype == np.float32 and got.shape == (4, H)
    assert got[:, 0].tolist() == [26.0, 36.0, 16.5, 16.5]
    assert decode_inputs(_Tables(), prompt, codes[:0]).shape == (0, H)


def test_teacher_forced_talker_feeds_every_row_once():
    talker = _EchoTalker()
    prefill = np.zeros((3, H), np.float32)
    decodes = np.arange(2 * H, dtype=np.float32).reshape(2, H)
    logits, hidden = teacher_forced_talker(talker, prefill, decodes)
    assert logits.shape == (3, V) and hidden.shape == (3, H)
    assert logits[0, 0] == 3 and np.array_equal(hidden[1:], decodes)
    assert len(talker.fed) == 3


def test_greedy_cb0_suppresses_control_ids_and_penalises_repeats():
    logits = np.zeros(V, np.float32)
    logits[5], logits[7], logits[EOS], logits[V - 1] = 2.0, 1.95, 9.0, 10.0
    assert greedy_cb0(logits, EOS) == 5  # control ids and EOS never win
    assert greedy_cb0(logits, EOS, allow_eos=True) == EOS
    assert greedy_cb0(logits, EOS, history=[5], repetition_penalty=1.05) == 7  # 2.0 / 1.05 < 1.95
    assert greedy_cb0(logits, EOS, history=[5]) == 5  # penalty 1: off
