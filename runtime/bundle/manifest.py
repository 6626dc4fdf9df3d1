"""The bundle manifest ``kztts.json``: its schema, reading and checking."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kztts.core.atomic import write_text
from kztts.core.errors import BundleError

MANIFEST_NAME = "kztts.json"
FORMAT = "kztts-bundle"
# 2: the CPU graphs' weights in one shared file (``weights``: each weight once); 1: each graph its own (still read)
FORMAT_VERSION = 2
READ_FORMAT_VERSIONS = (1, 2)
MODEL_TYPE = "qwen3_tts"
TOKENIZER_TYPE = "qwen3_tts_tokenizer_12hz"
# tts_model_type: Base clones a voice, CustomVoice speaks preset speakers, VoiceDesign makes a voice from an instruction
TTS_KINDS = ("base", "custom_voice", "voice_design")
BUILTIN_VOICE_KEY = "builtin_voice"  # a device bundle's Base built-in voice, its x-vector stored (kztts pack)

# Keys every manifest has; the nested ones are checked where they are used.
_REQUIRED = {
    "format": str, "format_version": int, "model_type": str, "tts_model_type": str,
    "tokenizer_type": str, "source": dict, "config": dict, "special_ids": dict,
    "languages": dict, "generation": dict, "embeddings": dict, "graphs": dict,
}
# A causal-LM bundle (``kind`` "lm", ``kztts.export.lm.bundle_writer``): the Talker's graph kinds over the
# LM's decoder stack (its config under ``config.lm``), a ``token_embedding`` table, ChatML facts.
KIND_LM = "lm"
# qwen3_next: a hybrid LM (Gated DeltaNet + gated attention; its graphs are kztts.bundle.graphs' hybrid kinds,
# its config.lm adds layer_types and the DeltaNet shapes)
LM_MODEL_TYPES = ("qwen2", "qwen3", "qwen3_next")
_LM_REQUIRED = {
    "format": str, "format_version": int, "kind": str, "model_type": str, "source": dict, "config": dict,
    "special_ids": dict, "chat": dict, "generation": dict, "embeddings": dict, "graphs": dict,
}
_TALKER_KEYS = ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "rope_theta",
                "vocab", "max_positions")
_SPECIAL_KEYS = ("im_start", "im_end", "assistant", "tts_pad", "tts_bos", "tts_eos", "codec_pad",
                 "codec_bos", "codec_eos", "codec_think", "codec_nothink", "codec_think_bos",
                 "codec_think_eos")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple  # ints and symbolic names (str)

    @classmethod
    def from_json(cls, d: dict) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["shape"]))

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX graph of the bundle and the I/O the runtime expects from it."""

    name: str
    file: str
    variant: str  # "dynamic" (CPU) or "static" (HTP)
    precision: str  # "fp32", "fp16", "w8a16", ...
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, name: str, d: dict) -> "GraphSpec":
        try:
            return cls(name, d["file"], d["variant"], d["precision"],
                       tuple(TensorSpec.from_json(t) for t in d["inputs"]),
                       tuple(TensorSpec.from_json(t) for t in d["outputs"]),
                       {k: v for k, v in d.items() if k not in ("file", "variant", "precision", "inputs", "outputs")})
        except (KeyError, TypeError) as exc:
            raise BundleError(f"{MANIFEST_NAME}: graph {name!r} entry is malformed (missing {exc})") from exc

    def to_json(self) -> dict:
        return {"file": self.file, "variant": self.variant, "precision": self.precision,
                "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs], **self.extra}


@dataclass(frozen=True)
class Manifest:
    """Validated contents of ``kztts.json``."""

    path: Path
    data: dict[str, Any]
    graphs: dict[str, GraphSpec]

    @property
    def kind(self) -> str:
        """``"tts"`` (a Qwen3-TTS bundle) or ``"lm"`` (a causal LM)."""
        return self.data.get("kind", "tts")

    @property
    def talker(self) -> dict:
        """The decoder stack the Talker graph kinds run: the Talker, or an LM bundle's LM."""
        return self.data["config"]["lm" if self.kind == KIND_LM else "talker"]

    @property
    def hybrid(self) -> bool:
        """An LM bundle of a hybrid model (``config.lm.layer_types``: DeltaNet and attention layers)."""
        return self.kind == KIND_LM and "layer_types" in self.data["config"].get("lm", {})

    @property
    def code_predictor(self) -> dict:
        return self.data["config"]["code_predictor"]

    @property
    def tts_kind(self) -> str:
        """``tts_model_type``: "base", "custom_voice" or "voice_design"."""
        return self.data.get("tts_model_type", "base")

    @property
    def speakers(self) -> dict[str, dict]:
        """A CustomVoice bundle's preset speakers, {name: {"id": codec id, "dialect": language name or None}};
        empty for the other kinds (and bundles written before the key)."""
        return self.data.get("speakers") or {}

    @property
    def takes_instruction(self) -> bool:
        """Whether an instruction goes into the prompt (qwen-tts 0.1.1: VoiceDesign, 1.7B CustomVoice)."""
        return bool(self.data.get("takes_instruction", False))

    @property
    def special_ids(self) -> dict:
        return self.data["special_ids"]

    @property
    def languages(self) -> dict[str, int]:
        return self.data["languages"]

    @property
    def generation(self) -> dict:
        return self.data["generation"]

    @property
    def embeddings(self) -> dict:
        return self.data["embeddings"]

    @property
    def random_weights(self) -> dict | None:
        """The provenance of a random-weight checkpoint (the demo, ``kztts make-tiny``), else None:
        such a bundle's audio is not speech, and any quality figure from it only shows the measuring works."""
        return self.data.get("random_weights")

    @property
    def htp_check(self) -> dict | None:
        """How the export judged its quantized HTP graphs on the HTP simulator (``kztts.export.htp.export_check``, judged by ``kztts.export.validate.htp_check``):
        ``{"status": "validated", "target", "figures", "bounds", ...}`` when they passed their bounds, ``{"status":
        "unvalidated", "reason"}`` when nothing checked them (no QNN execution provider where it was exported, or
        a build that skipped the check); None when the bundle has no quantized HTP graph (or predates the key)."""
        return self.data.get("htp_check")

    @property
    def htp_unvalidated(self) -> bool:
        """Quantized HTP graphs that no simulator run judged at export (``htp_check`` status "unvalidated")."""
        return (self.htp_check or {}).get("status") == HTP_UNVALIDATED


HTP_VALIDATED, HTP_UNVALIDATED = "validated", "unvalidated"  # htp_check statuses


def random_weights_label(info: dict) -> str:
    """One phrase for a ``random_weights`` provenance, e.g. "kztts make-tiny, size 0.6b, seed 1234"."""
    parts = [str(info.get("made_by") or "random init")]
    parts += [f"{k} {info[k]}" for k in ("size", "seed") if info.get(k) is not None]
    return ", ".join(parts)


def read_manifest(bundle_dir: Path) -> Manifest:
    """Read and check ``bundle_dir/kztts.json``; raise BundleError naming the problem."""
    path = Path(bundle_dir) / MANIFEST_NAME
    if not Path(bundle_dir).is_dir():
        raise BundleError(f"{bundle_dir}: not a directory; give a bundle made by `kztts export`")
    if not path.is_file():
        raise BundleError(f"{path}: manifest missing; {bundle_dir} is not a kztts bundle "
                          "(make one with `kztts export MODEL_DIR -o BUNDLE_DIR`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: not valid JSON ({exc}); re-export the bundle") from exc
    if not isinstance(data, dict):
        raise BundleError(f"{path}: expected a JSON object")
    lm = data.get("kind") == KIND_LM
    for key, typ in (_LM_REQUIRED if lm else _REQUIRED).items():
        if key not in data:
            raise BundleError(f"{path}: missing key {key!r}; re-export the bundle")
        if not isinstance(data[key], typ):
            raise BundleError(f"{path}: key {key!r} should be a {typ.__name__}")
    if data["format"] != FORMAT:
        raise BundleError(f"{path}: format is {data['format']!r}, expected {FORMAT!r}")
    if data["format_version"] not in READ_FORMAT_VERSIONS:
        raise BundleError(f"{path}: format_version {data['format_version']} is not supported by this "
                          f"kztts (reads {', '.join(map(str, READ_FORMAT_VERSIONS))}); re-export the bundle with "
                          "this version")
    weights = data.get("weights")
    if weights is not None and not (isinstance(weights, dict) and isinstance(weights.get("file"), str)
                                    and isinstance(weights.get("bytes"), int)):
        raise BundleError(f"{path}: weights should be an object with file and bytes; re-export the bundle")
    if lm:
        return _read_lm(path, data)
    if data["model_type"] != MODEL_TYPE or data["tokenizer_type"] != TOKENIZER_TYPE:
        raise BundleError(f"{path}: model_type {data['model_type']!r} / tokenizer_type "
                          f"{data['tokenizer_type']!r}: kztts runs only {MODEL_TYPE} with "
                          f"{TOKENIZER_TYPE}")
    talker = data["config"].get("talker")
    if not isinstance(talker, dict) or any(k not in talker for k in _TALKER_KEYS):
        missing = [k for k in _TALKER_KEYS if not isinstance(talker, dict) or k not in talker]
        raise BundleError(f"{path}: config.talker lacks {missing}")
    if data["tts_model_type"] not in TTS_KINDS:
        raise BundleError(f"{path}: tts_model_type {data['tts_model_type']!r}: kztts runs {', '.join(TTS_KINDS)}")
    speakers = data.get("speakers") or {}
    if not isinstance(speakers, dict) or any(not isinstance(v, dict) or not isinstance(v.get("id"), int)
                                             or (v.get("dialect") is not None and v["dialect"] not in data["languages"])
                                             for v in speakers.values()):
        raise BundleError(f"{path}: speakers should map names to {{id, dialect}} with a known dialect; "
                          "re-export the bundle")
    missing = [k for k in _SPECIAL_KEYS if k not in data["special_ids"]]
    if missing:
        raise BundleError(f"{path}: special_ids lacks {missing}")
    if not isinstance(data.get("random_weights"), (dict, type(None))):
        raise BundleError(f"{path}: random_weights should be an object or null; re-export the bundle")
    check = data.get("htp_check")
    if check is not None and (not isinstance(check, dict) or check.get("status") not in (HTP_VALIDATED,
                                                                                          HTP_UNVALIDATED)):
        raise BundleError(f"{path}: htp_check should be an object with status {HTP_VALIDATED!r} or "
                          f"{HTP_UNVALIDATED!r}; re-export the bundle")
    graphs = {name: GraphSpec.from_json(name, g) for name, g in data["graphs"].items()}
    return Manifest(path, data, graphs)


def _read_lm(path: Path, data: dict) -> Manifest:
    if data["model_type"] not in LM_MODEL_TYPES:
        raise BundleError(f"{path}: LM model_type {data['model_type']!r}: kztts runs {', '.join(LM_MODEL_TYPES)}")
    stack = data["config"].get("lm")
    missing = [k for k in _TALKER_KEYS if not isinstance(stack, dict) or k not in stack]
    if missing:
        raise BundleError(f"{path}: config.lm lacks {missing}; re-export the bundle")
    graphs = {name: GraphSpec.from_json(name, g) for name, g in data["graphs"].items()}
    return Manifest(path, data, graphs)


def write_manifest(bundle_dir: Path, data: dict) -> Path:
    # atomic: an existing bundle's manifest is rewritten in place (add_context_binaries)
    return write_text(Path(bundle_dir) / MANIFEST_NAME, json.dumps(data, indent=1, sort_keys=False) + "\n")


def bundle_digest(bundle_dir: Path, length: int = 16) -> str:
    """The first ``length`` hex digits of a sha256 over every file of a bundle (relative name and
    bytes): two reports name the same bundle exactly when their digests are equal, on any machine."""
    import hashlib

    root = Path(bundle_dir)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:length]
