"""DNSMOS P.835 speech-quality scores (SIG, BAK, OVRL) on ONNX Runtime; optional extra ``kztts[quality]``.

DNSMOS P.835 (Reddy, Gopal & Cutler, "DNSMOS P.835: A non-intrusive perceptual objective speech
quality metric to evaluate noise suppressors", ICASSP 2022) predicts, from 16 kHz audio alone, the
ITU-T P.835 ratings of the speech signal (SIG), the background (BAK) and the overall quality (OVRL),
each on a 1-5 scale. Its ONNX models come from Microsoft's DNS-Challenge repository
(https://github.com/microsoft/DNS-Challenge, folder DNSMOS; the repository licenses its code under
MIT, LICENSE-CODE, and its other content under CC BY 4.0, LICENSE; the models themselves carry no
separate licence statement, see its issue #125). We take them from the PyPI package ``speechmos``
0.0.1.1 (MIT licence, "Copyright (c) Microsoft Corporation", by the AEC/DNS Challenge organisers),
which ships them as package data and declares no dependencies. Its Python module imports librosa
and requests, so it is never imported: only its folder is located and the ``.onnx`` files are
opened on ONNX Runtime here.

The computation follows ``speechmos/dnsmos.py`` (same as DNS-Challenge's ``dnsmos_local.py``):
audio at 16 kHz (ours is resampled from 24 kHz with ``kztts.core.audio.resample``), repeated end to end
until it is at least ``INPUT_LENGTH`` = 9.01 s long, then cut into 9.01 s windows at 1 s hops
(``int(floor(seconds) - 9.01) + 1`` hops, of which speechmos keeps only the full-length windows:
its float arithmetic makes the windows from 7 s on one sample short, so they are dropped, here too,
which keeps the scores equal to speechmos's); the ``sig_bak_ovr.onnx`` model gives raw
(SIG, BAK, OVRL) per window, mapped through the published polynomial fits (one set for the plain
model, ``dnsmos_models/``; one for the personalised model, ``pdnsmos_models/``, which also
penalises interfering talkers), and averaged over the windows. The P.808 score (``model_v8.onnx``,
which needs a librosa mel spectrogram) is not computed.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kztts.core.audio import resample
from kztts.core.errors import KzttsError

log = logging.getLogger(__name__)

RATE = 16000
INPUT_LENGTH = 9.01  # seconds per window, as speechmos
NOT_INSTALLED = "not installed (pip install 'kztts[quality]')"
COLUMNS = ("SIG", "BAK", "OVRL")

# np.poly1d coefficients (highest power first) mapping raw model outputs to P.835 scores, from speechmos.
_FITS = {
    False: {"sig": [-0.08397278, 1.22083953, 0.0052439], "bak": [-0.13166888, 1.60915514, -0.39604546],
            "ovrl": [-0.06766283, 1.11546468, 0.04602535]},
    True: {"sig": [-0.01019296, 0.02751166, 1.19576786, -0.24348726],
           "bak": [-0.04976499, 0.44276479, -0.1644611, 0.96883132],
           "ovrl": [-0.00533021, 0.005101, 1.18058466, -0.11236046]},
}


@dataclass(frozen=True)
class DnsmosScore:
    """P.835 scores (1-5) of one clip, or their mean over clips."""

    sig: float
    bak: float
    ovrl: float

    def columns(self) -> dict[str, str]:
        return {"SIG": f"{self.sig:.2f}", "BAK": f"{self.bak:.2f}", "OVRL": f"{self.ovrl:.2f}"}


def model_path(personalized: bool = False) -> Path | None:
    """The ``sig_bak_ovr.onnx`` shipped by speechmos, or None when speechmos is not installed."""
    spec = importlib.util.find_spec("speechmos")  # locates the folder without running its imports
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / ("pdnsmos_models" if personalized else "dnsmos_models")
    path = path / "sig_bak_ovr.onnx"
    return path if path.is_file() else None


def available() -> bool:
    """True when the DNSMOS models can be found (the ``quality`` extra is installed)."""
    return model_path() is not None


@functools.lru_cache(maxsize=2)
def _session(path: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])


def windows(audio16k: np.ndarray) -> np.ndarray:
    """The 9.01 s windows [N, 144160] speechmos scores for a 16 kHz clip (repeated when shorter)."""
    audio = np.asarray(audio16k, dtype=np.float32)
    if audio.size == 0:
        raise KzttsError("DNSMOS needs audio: the clip is empty")
    size = int(INPUT_LENGTH * RATE)
    while len(audio) < size:
        audio = np.append(audio, audio)
    hops = int(np.floor(len(audio) / RATE) - INPUT_LENGTH) + 1
    segs = [audio[int(i * RATE): int((i + INPUT_LENGTH) * RATE)] for i in range(hops)]
    return np.stack([s for s in segs if len(s) >= size])


def score(samples: np.ndarray, sample_rate: int, personalized: bool = False) -> DnsmosScore:
    """DNSMOS P.835 of mono float ``samples`` (values clipped to [-1, 1], as speechmos requires)."""
    path = model_path(personalized)
    if path is None:
        raise KzttsError(f"DNSMOS is {NOT_INSTALLED}")
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    if sample_rate != RATE:
        x = resample(x, sample_rate, RATE)
    batch = windows(x)
    sess = _session(str(path))
    raw = sess.run(None, {sess.get_inputs()[0].name: batch})[0]  # [N, 3]: sig, bak, ovrl
    fits = _FITS[personalized]
    sig, bak, ovrl = (float(np.mean(np.poly1d(fits[k])(raw[:, i]))) for i, k in enumerate(("sig", "bak", "ovrl")))
    return DnsmosScore(sig=sig, bak=bak, ovrl=ovrl)


def score_or_note(samples: np.ndarray, sample_rate: int) -> DnsmosScore | str:
    """``score``, or the ``NOT_INSTALLED`` note when the extra is missing (a table cell, not a failure)."""
    return score(samples, sample_rate) if available() else NOT_INSTALLED


def mean_score(scores: list[DnsmosScore | str]) -> DnsmosScore | str:
    """Mean of the scores over seeds; the note itself when any of them is one."""
    if not scores:
        raise ValueError("mean_score needs at least one score")
    notes = [s for s in scores if isinstance(s, str)]
    if notes:
        return notes[0]
    return DnsmosScore(*(float(np.mean([getattr(s, k) for s in scores])) for k in ("sig", "bak", "ovrl")))


def columns(value: DnsmosScore | str) -> dict[str, str]:
    """Table cells SIG, BAK, OVRL: the scores, or the note in each."""
    return value.columns() if isinstance(value, DnsmosScore) else {c: value for c in COLUMNS}
