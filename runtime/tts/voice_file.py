"""Saved voices: a voice computed once from audio (``TTS.voice_from_wav`` / ``voice_from_reference``), written to a
file and loaded again without running the speaker encoder or the speech encoder (``kztts voice create``,
``kztts synth --voice``, ``TTS.voice_from_file``, ``kztts serve --voices``).

The file (``NAME.voice``) is a NumPy ``.npz`` archive (a zip; read with ``allow_pickle=False``) holding
- ``meta``: UTF-8 JSON as uint8: ``format`` "kztts-voice", ``version`` 1, ``kind`` "xvector" or "icl",
  ``ref_text`` (ICL) and ``model``: the checkpoint it was computed with (``source_sha256``, the bundle
  manifest's ``source.sha256``), ``speaker_embedding_size``, ``num_code_groups``, ``codebook_size``;
- ``xvector``: float32 [speaker_embedding_size];
- ``ref_codes``: int64 [frames, num_code_groups] (ICL only).

Loading checks all of it: the format and version, the arrays' types and shapes against ``meta``, and ``model``
against the bundle: a voice is the output of one checkpoint's encoders, so a bundle of another checkpoint (or
whose shapes differ) refuses it in one line. Every variant of one checkpoint (int8, int4, ``--target``) takes it.
Only Base bundles take saved voices (the other kinds clone none).
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from kztts.bundle.manifest import Manifest
from kztts.core.atomic import atomic_outputs
from kztts.core.errors import KzttsError
from kztts.tts.request import Voice

FORMAT = "kztts-voice"
VERSION = 1
SUFFIX = ".voice"
_REMAKE = "make it again with `kztts voice create REF.wav -o NAME.voice --bundle BUNDLE`"


def model_identity(manifest: Manifest) -> dict:
    """What a voice file must match in a bundle: its checkpoint and the shapes a voice feeds."""
    config = manifest.data["config"]
    return {"source_sha256": str(manifest.data["source"].get("sha256", "")),
            "speaker_embedding_size": int(config["speaker_embedding_size"]),
            "num_code_groups": int(manifest.talker.get("num_code_groups", 16)),
            "codebook_size": int(manifest.code_predictor.get("vocab", 2048))}


def save_voice(path: str | Path, voice: Voice, manifest: Manifest) -> Path:
    """Write ``voice`` (computed by the bundle of ``manifest``) to ``path`` (all or nothing)."""
    if voice.preset is not None:
        raise KzttsError(f"{path}: preset speaker {voice.preset!r} needs no file: name it with --speaker")
    meta = {"format": FORMAT, "version": VERSION, "kind": "icl" if voice.icl else "xvector",
            "ref_text": voice.ref_text if voice.icl else None, "model": model_identity(manifest)}
    arrays = {"meta": np.frombuffer(json.dumps(meta, ensure_ascii=False).encode(), dtype=np.uint8),
              "xvector": np.asarray(voice.speaker, dtype=np.float32).reshape(-1)}
    if voice.icl:
        arrays["ref_codes"] = np.asarray(voice.ref_codes, dtype=np.int64)
    with atomic_outputs([path]) as (tmp,):
        with open(tmp, "wb") as f:  # a file object: savez adds no .npz to the name
            np.savez(f, **arrays)
    return Path(path)


# the first bytes of a recording (FLAC, Ogg, MP3 with an ID3 tag; a WAV: RIFF, its size, WAVE): a file given where a
# saved voice belongs
_RECORDING_MAGIC = (b"fLaC", b"OggS", b"ID3")


def _is_recording(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return head.startswith(_RECORDING_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WAVE")


def _read(path: Path) -> tuple[dict, dict]:
    if _is_recording(path):
        raise KzttsError(f"{path}: a recording, not a saved voice; give it as --speaker-wav {path} (or save it as a "
                         f"voice once: kztts voice create {path} -o NAME{SUFFIX})")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise KzttsError(f"{path}: no such voice file; {_REMAKE}") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise KzttsError(f"{path}: not a kztts voice file ({exc}); {_REMAKE}") from None
    if "meta" not in arrays or arrays["meta"].dtype != np.uint8:
        raise KzttsError(f"{path}: not a kztts voice file (no 'meta' entry); {_REMAKE}")
    try:
        meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KzttsError(f"{path}: its 'meta' entry is not JSON ({exc}); {_REMAKE}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise KzttsError(f"{path}: not a kztts voice file (format {meta.get('format') if isinstance(meta, dict) else meta!r}); "
                         f"{_REMAKE}")
    if meta.get("version") != VERSION:
        raise KzttsError(f"{path}: voice file version {meta.get('version')!r}; this kztts reads version {VERSION}; "
                         f"{_REMAKE}")
    return meta, arrays


def load_voice(path: str | Path, manifest: Manifest) -> Voice:
    """The voice saved in ``path``, checked against the bundle of ``manifest`` (module docstring)."""
    path = Path(path)
    meta, arrays = _read(path)
    if manifest.tts_kind != "base":
        raise KzttsError(f"{path}: a saved voice clones a voice, which a {manifest.tts_kind} bundle does not do; "
                         "name a preset speaker (CustomVoice) or give an instruction (VoiceDesign)")
    want, made = model_identity(manifest), meta.get("model") or {}
    if made.get("source_sha256") != want["source_sha256"]:
        raise KzttsError(f"{path}: made by another model (checkpoint {str(made.get('source_sha256'))[:12]}, this bundle's "
                         f"is {want['source_sha256'][:12]}): a voice is one model's encoders' output; {_REMAKE}")
    for key in ("speaker_embedding_size", "num_code_groups", "codebook_size"):
        if made.get(key) != want[key]:
            raise KzttsError(f"{path}: made for {key} {made.get(key)}, this bundle has {want[key]}; {_REMAKE}")
    xvector = arrays.get("xvector")
    if xvector is None or xvector.dtype != np.float32 or xvector.shape != (want["speaker_embedding_size"],) \
            or not np.all(np.isfinite(xvector)):
        raise KzttsError(f"{path}: its x-vector is not float32 [{want['speaker_embedding_size']}] finite values; "
                         f"{_REMAKE}")
    if meta.get("kind") == "xvector":
        return Voice(xvector)
    codes, ref_text = arrays.get("ref_codes"), meta.get("ref_text")
    if meta.get("kind") != "icl" or not isinstance(ref_text, str) or not ref_text.strip() or codes is None \
            or codes.dtype != np.int64 or codes.ndim != 2 or codes.shape[0] == 0 \
            or codes.shape[1] != want["num_code_groups"] or codes.min() < 0 or codes.max() >= want["codebook_size"]:
        raise KzttsError(f"{path}: its ICL reference (kind, ref_text, ref_codes [frames, {want['num_code_groups']}] "
                         f"below {want['codebook_size']}) is malformed; {_REMAKE}")
    return Voice(xvector, codes, ref_text)
