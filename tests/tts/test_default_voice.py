"""``TTS.default_voice``: who speaks a request that names no one, one rule per bundle kind (Base: the built-in
voice, the x-vector of ``synthetic_voice()``; CustomVoice: the first preset speaker; VoiceDesign: none), applied by
every speaking method of the library: ``synthesize``, ``stream_text`` and ``synthesize_many`` without a voice speak
exactly what they speak with the default given. The CLI's and the server's routes: tests/cli/test_voice_rule.py,
tests/server/test_voice_rule.py."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from kztts import TTS
from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError

TEXT = "Who speaks here?"
OPTIONS = dict(greedy=True, max_frames=6)


@pytest.fixture(scope="module")
def base(equal_bundle):
    return TTS(equal_bundle)


@pytest.fixture(scope="module")
def custom(custom_voice_bundle):
    return TTS(custom_voice_bundle)


def test_base_speaks_with_the_built_in_voice_on_every_method(base):
    builtin = base.voice_from_wav(synthetic_voice(), 24000)
    assert np.array_equal(base.default_voice().speaker, builtin.speaker)
    assert np.array_equal(base.synthesize(TEXT, **OPTIONS).samples, base.synthesize(TEXT, builtin, **OPTIONS).samples)
    written = np.concatenate(list(base.stream_text(["Who ", "speaks ", "here?"], **OPTIONS)))
    assert np.array_equal(written, np.concatenate(list(base.stream_text([TEXT], builtin, **OPTIONS))))
    (many,) = base.synthesize_many([dict(text=TEXT, **OPTIONS)])
    assert np.array_equal(many.codes, base.synthesize(TEXT, builtin, **OPTIONS).codes)


def test_custom_voice_speaks_its_first_preset_speaker(custom):
    first = next(iter(custom.kind.speakers))
    assert custom.kind.default_speaker == first and custom.default_voice().preset == first
    want = custom.synthesize(TEXT, speaker=first, **OPTIONS)
    assert np.array_equal(custom.synthesize(TEXT, **OPTIONS).samples, want.samples)
    assert np.array_equal(np.concatenate(list(custom.stream_text([TEXT], **OPTIONS))),
                          np.concatenate(list(custom.stream_text([TEXT], speaker=first, **OPTIONS))))


def test_voice_design_has_no_default_voice(voice_design_bundle):
    tts = TTS(voice_design_bundle)
    assert tts.default_voice() is None and tts.synthesize(TEXT, **OPTIONS).frames > 0


def test_a_base_bundle_without_a_speaker_encoder_names_the_voices_it_takes(equal_bundle, tmp_path):
    """No speaker encoder, so no built-in voice: one line naming what to give instead (a bad build that fell back to
    a zero x-vector would speak instead of refusing)."""
    copy = tmp_path / "no-encoder"
    copy.mkdir()
    for item in equal_bundle.iterdir():
        if item.name != "kztts.json":
            os.symlink(item, copy / item.name)
    manifest = json.loads((equal_bundle / "kztts.json").read_text())
    del manifest["graphs"]["speaker_encoder"]
    (copy / "kztts.json").write_text(json.dumps(manifest))
    tts = TTS(copy)
    with pytest.raises(KzttsError, match=r"speaker_encoder.*saved voice \(--voice F.voice\) or an x-vector"):
        tts.synthesize(TEXT, **OPTIONS)
