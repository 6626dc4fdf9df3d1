"""The real-vocoder judge (kztts.export.validate.vocoder) on Piper's en_US-joe-medium voice: its decoder cut out
and run through kztts equals ONNX Runtime's run of the whole voice, and the recipe the study chose keeps its
measured SNR and WER (benchmarks/piper_decoder/README.md)."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.core.errors import KzttsError
from kztts.eval import piper_voice as P

pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def voice_dir():
    if not P.espeak_available():
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng): the Piper voice needs its phonemes")
    try:
        return P.fetch_voice()
    except KzttsError as exc:
        pytest.skip(f"the Piper voice cannot be fetched: {exc}")


def test_cut_decoder_through_kztts_equals_the_whole_voice(voice_dir, tmp_path):
    from kztts.export.validate.graph_plan import run_on_cpu
    from kztts.export.validate.vocoder import cut_decoder

    voice = P.PiperVoice(voice_dir)
    wav, latent = voice.synthesize("The birch canoe slid on the smooth planks.")
    assert latent.shape[:2] == (1, 192) and wav.size == latent.shape[2] * P.HOP
    got = run_on_cpu(cut_decoder(voice_dir, tmp_path / "decoder.onnx"), [{P.DECODER_INPUT: latent}])[0]
    assert np.array_equal(got.reshape(-1), wav)
