"""Loading a Qwen2/Qwen3 causal LM (a Hugging Face directory or a GGUF file of one), or a hybrid Qwen3-Next /
Qwen3.5 one (``qwen3_next``, a directory), for export.

``load_causal_lm`` gives the transformers model in fp32 eval mode, the checkpoint's tokenizer saved
as a ``tokenizer.json`` that the ``tokenizers`` library loads (checked to encode like transformers'
own tokenizer), its chat template and the structural facts an exporter needs (:class:`LMFacts`).

A GGUF file is read by transformers itself (``from_pretrained(folder, gguf_file=name)``, which needs
the ``gguf`` package): its tensors are dequantized to fp32 and its tokenizer (``tokenizer.ggml.*``
metadata) is converted to a fast tokenizer. A quantized GGUF's weights stay on their quantization
grid after dequantization, which flatters any later int4 re-quantization of them.

Wrong inputs are refused in one line before anything heavy: :func:`check_causal_lm` reads only
``config.json`` or the GGUF's metadata.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from kztts.core.atomic import atomic_path
from kztts.core.cache import cache_dir
from kztts.core.errors import KzttsError
from kztts.export.lm.gguf_meta import GGUFMeta, read_gguf_meta

log = logging.getLogger(__name__)

MODEL_TYPES = ("qwen2", "qwen3", "qwen3_next")
GGUF_MODEL_TYPES = ("qwen2", "qwen3")
# GGUF architectures of the hybrids: the format carries them (gguf's QWEN3NEXT, QWEN35), transformers 4.57
# cannot load them (no GGUF mapping for their DeltaNet tensors)
_GGUF_HYBRIDS = ("qwen3next", "qwen35", "qwen35moe")
_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}
_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types (tokenizer.ggml.token_type)
TOKENIZER_FILE = "tokenizer.json"

# Encoded by the saved tokenizer.json and by transformers' tokenizer: they must give the same ids.
CHECK_STRINGS = (
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Où est la bibliothèque ? Elle ferme à 18 h, n'est-ce pas ?",
    "请用中文解释一下快速排序算法的原理。",
    "The quick brown fox jumps over the lazy dog, 3.14159 times.",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
)


@dataclass(frozen=True)
class LMFacts:
    """The structure of a Qwen2/Qwen3 causal LM, as its config states it."""

    model_type: str  # "qwen2" or "qwen3"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    max_positions: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: q/k/v projections carry biases
    qk_norm: bool  # Qwen3: per-head RMSNorm of q and k
    eos_ids: tuple[int, ...]  # the generation config's end tokens (the config's when it has none)
    im_end_id: int | None  # "<|im_end|>", the ChatML end of a turn (None when the vocabulary lacks it)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LoadedLM:
    """A loaded checkpoint: ``model`` (transformers ``Qwen2ForCausalLM``/``Qwen3ForCausalLM``, fp32,
    eval mode, CPU), ``tokenizer_json`` (a ``tokenizers.Tokenizer.from_file`` path), ``chat_template``
    (the checkpoint's Jinja template, None when it has none), ``facts``, ``source`` (the directory or
    GGUF file), ``gguf_tensors`` (the GGUF's tensor count, None for a directory) and ``hf_tokenizer``
    (transformers' fast tokenizer the file was saved from: it renders the chat template)."""

    model: object
    tokenizer_json: Path
    chat_template: str | None
    facts: LMFacts
    source: Path
    gguf_tensors: int | None = None
    hf_tokenizer: object = None


def _check_gguf(path: Path) -> GGUFMeta:
    """The header of a GGUF file of a Qwen2/Qwen3 LM that this environment can load."""
    meta = read_gguf_meta(path)
    arch = meta.values.get("general.architecture")
    if arch in _GGUF_HYBRIDS:
        raise KzttsError(f"{path}: a GGUF of the hybrid architecture {arch!r}: transformers (the export extra's "
                         "4.57) has no GGUF loader for its Gated DeltaNet tensors; export the Hugging Face "
                         "checkpoint directory instead (kztts export HYBRID_DIR -o BUNDLE)")
    if arch not in GGUF_MODEL_TYPES:
        raise KzttsError(f"{path}: a GGUF of architecture {arch!r}, not qwen2/qwen3; kztts loads Qwen2/Qwen3 "
                         "causal LMs only")
    if importlib.util.find_spec("gguf") is None:  # transformers dequantizes the tensors with it
        raise KzttsError(f"{path}: loading a GGUF file needs the gguf package: pip install gguf "
                         "(it is part of the export extra: pip install -e '.[export]')")
    return meta


def _add_gguf_special_tokens(tokenizer, meta: GGUFMeta) -> None:
    """Make the GGUF's control tokens (``<|fim_prefix|>``, ...) special and its user-defined ones
    (``<tool_call>``) added tokens, as in the original tokenizer: transformers' GGUF converter registers
    only ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>``, so the others would be split into pieces."""
    from tokenizers import AddedToken

    tokens = meta.values.get("tokenizer.ggml.tokens") or []
    types = meta.values.get("tokenizer.ggml.token_type") or []
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    tokenizer.add_special_tokens({"additional_special_tokens": control}, replace_additional_special_tokens=False)
    tokenizer.add_tokens(user)


def _check_directory(path: Path) -> str:
    cfg_path = path / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KzttsError(f"{cfg_path}: missing; {path} is not a Hugging Face checkpoint directory "
                         "(give one, or a .gguf file)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KzttsError(f"{cfg_path}: not valid JSON ({exc})") from exc
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    if model_type not in MODEL_TYPES:
        raise KzttsError(f"{cfg_path}: model_type is {model_type!r}, not {'/'.join(MODEL_TYPES)}; kztts loads those "
                         "causal LMs only (a Qwen3-TTS checkpoint goes to kztts export as a TTS model)")
    archs = cfg.get("architectures") or [_ARCHITECTURES[model_type]]
    if _ARCHITECTURES[model_type] not in archs:
        raise KzttsError(f"{cfg_path}: architectures {archs} do not include {_ARCHITECTURES[model_type]}; "
                         "kztts loads causal LMs only")
    return model_type


def check_causal_lm(path: str | Path) -> str:
    """The model type ("qwen2"/"qwen3") of a causal-LM directory or GGUF file, read from its config or
    metadata only; a KzttsError naming the path for anything else."""
    path = Path(path)
    if path.is_dir():
        return _check_directory(path)
    if path.is_file():
        return _check_gguf(path).values["general.architecture"]
    raise KzttsError(f"{path}: no such file or directory; give a Qwen2/Qwen3 checkpoint directory or a .gguf file "
                     "(kztts fetch-lm downloads one)")


def _facts(model, tokenizer) -> LMFacts:
    c = model.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = c.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # a hybrid's first layers may be DeltaNet layers: the attention facts are its attention layers'
    layer = next(l.self_attn for l in model.model.layers if hasattr(l, "self_attn"))
    return LMFacts(model_type=c.model_type, hidden=c.hidden_size, layers=c.num_hidden_layers, heads=heads,
                   kv_heads=c.num_key_value_heads, head_dim=head_dim, ffn=c.intermediate_size,
                   vocab=c.vocab_size, rope_theta=float(c.rope_theta), rms_eps=float(c.rms_norm_eps),
                   max_positions=c.max_position_embeddings, tie_word_embeddings=bool(c.tie_word_embeddings),
                   qkv_bias=layer.q_proj.bias is not None, qk_norm=hasattr(layer, "q_norm"),
                   eos_ids=tuple(int(i) for i in eos_ids),
                   im_end_id=None if im_end is None or im_end == tokenizer.unk_token_id else int(im_end))


def default_tokenizer_dir(path: Path) -> Path:
    """Where the tokenizer of ``path`` is saved by default: the kztts cache, keyed by the resolved
    path, size and modification time (a changed checkpoint gets a fresh folder)."""
    path = Path(path).resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "lm_tokenizers" / f"{path.stem}-{key}"


def save_tokenizer(tokenizer, out_dir: Path, source: Path) -> Path:
    """Save ``tokenizer``'s ``tokenizers`` backend as ``out_dir/tokenizer.json`` and check the file
    encodes :data:`CHECK_STRINGS` to the same ids as ``tokenizer``."""
    from tokenizers import Tokenizer


    if not getattr(tokenizer, "is_fast", False):
        raise KzttsError(f"{source}: the tokenizer loaded as a slow one ({type(tokenizer).__name__}); "
                         "install `tokenizers` so transformers can convert it")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TOKENIZER_FILE
    with atomic_path(path) as tmp:
        tokenizer.backend_tokenizer.save(str(tmp))
        saved = Tokenizer.from_file(str(tmp))
        for text in CHECK_STRINGS:
            want = tokenizer.encode(text, add_special_tokens=False)
            got = saved.encode(text, add_special_tokens=False).ids
            if got != want:
                raise KzttsError(f"{source}: the saved tokenizer.json encodes {text[:30]!r} as {got[:12]}..., "
                                 f"transformers as {want[:12]}...; this tokenizer cannot be exported")
    return path


def load_causal_lm(path: str | Path, tokenizer_dir: str | Path | None = None) -> LoadedLM:
    """Load a Qwen2/Qwen3 causal LM from a Hugging Face directory or a GGUF file: fp32 eval model,
    ``tokenizer.json`` saved into ``tokenizer_dir`` (default :func:`default_tokenizer_dir`), chat
    template and :class:`LMFacts`."""
    path = Path(path)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = _check_gguf(path) if path.is_file() else None
    model_type = meta.values["general.architecture"] if meta else check_causal_lm(path)
    folder, kw, config_kw = (path.parent, {"gguf_file": path.name}, {}) if meta else (path, {}, {})
    head_dim = meta.values.get(f"{model_type}.attention.key_length") if meta else None
    if model_type == "qwen3" and head_dim:
        config_kw["head_dim"] = head_dim  # transformers 4.57 maps no GGUF key to it: Qwen3 would get 128
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kw, **config_kw)
    except (OSError, ValueError, KeyError) as exc:  # missing files, unsupported metadata
        raise KzttsError(f"{path}: transformers cannot load this {model_type} checkpoint "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    if meta:
        _add_gguf_special_tokens(tokenizer, meta)
    model = model.float().eval()
    tokenizer_json = save_tokenizer(tokenizer, Path(tokenizer_dir) if tokenizer_dir else default_tokenizer_dir(path),
                                    path)
    facts = _facts(model, tokenizer)
    log.info("loaded %s: %s", path, facts)
    return LoadedLM(model=model, tokenizer_json=tokenizer_json, chat_template=tokenizer.chat_template,
                    facts=facts, source=path, gguf_tensors=meta.tensor_count if meta else None,
                    hf_tokenizer=tokenizer)


__all__ = ["CHECK_STRINGS", "LMFacts", "LoadedLM", "MODEL_TYPES", "check_causal_lm", "default_tokenizer_dir",
           "load_causal_lm", "save_tokenizer"]
