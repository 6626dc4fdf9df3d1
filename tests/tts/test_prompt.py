"""Embedding tables, tokenizer export and the numpy talker prompt against qwen-tts.

For both tiny variants, every prompt mode (x-vector / ICL, streaming / non-streaming),
language auto and explicit, and a short and a long text, the prefill embeddings,
trailing text and tts_pad that qwen-tts's ``generate`` builds are captured (its
``talker.generate`` is patched to record its inputs and stop: nothing is generated)
and compared with ``kztts.tts.prompt.build_prompt`` on tables exported to a temp dir.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from kztts.bundle.embeddings import EmbeddingTables, bf16_to_f32
from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError
from kztts.tts.prompt import build_prompt, language_id
from kztts.tts.text.tokenizer import TextTokenizer

TOL = 1e-5
MODES = ("xvec_stream", "xvec_nonstream", "icl_stream", "icl_nonstream")
TEXTS = {
    "short": "Hello world, this is a tiny test.",
    # longer than the ICL reference codes: exercises the streaming "leftover text" branch
    "long": ("The quick brown fox jumps over the lazy dog 42 times; 你好，世界！ iPhone users "
             "paid $1,299.99 on 2024-01-01, didn't they? Yes, they did, and it's fine."),
}
REF_TEXT = "A reference sentence."


class _Captured(Exception):
    pass


@pytest.fixture(scope="module")
def ref_model(reference):
    """The reference wrapper with its text embedding bf16-exact (as real bf16 checkpoints are)."""
    w = reference.model.talker.model.text_embedding.weight
    with torch.no_grad():
        if not bool(((w.view(torch.int32) & 0xFFFF) == 0).all()):
            w.copy_(w.to(torch.bfloat16).to(torch.float32))
    return reference


@pytest.fixture(scope="module")
def exported(ref_model, tiny_model_dir, tmp_path_factory):
    """Embedding tables + tokenizer.json exported into a temp bundle dir."""
    from kztts.export.common.embeddings import export_embeddings
    from kztts.export.common.tokenizer import export_tokenizer
    from kztts.export.tts.tts_parts import special_ids

    out = tmp_path_factory.mktemp("bundle")
    spec = export_embeddings(ref_model.model, out)
    assert export_tokenizer(tiny_model_dir, out) == "tokenizer.json"
    sids = special_ids(ref_model.model)
    tables = EmbeddingTables(out, spec, sids)
    return dict(dir=out, spec=spec, special_ids=sids, tables=tables, tok=TextTokenizer(out),
                languages=dict(ref_model.model.config.talker_config.codec_language_id))


@pytest.fixture(scope="module")
def voice(ref_model):
    """The reference's voice-clone prompt items (x-vector and ICL) for the synthetic voice."""
    tts = ref_model
    wav = synthetic_voice()
    return {
        "xvec": tts.create_voice_clone_prompt(ref_audio=(wav, 24000), x_vector_only_mode=True)[0],
        "icl": tts.create_voice_clone_prompt(ref_audio=(wav, 24000), ref_text=REF_TEXT,
                                             x_vector_only_mode=False)[0],
    }


@torch.no_grad()
def capture(tts, item, text: str, language: str, non_streaming: bool) -> dict:
    """What qwen-tts's generate passes to talker.generate for this prompt."""
    model = tts.model
    got: dict = {}

    def stop(*args, **kwargs):
        got.update({k: kwargs[k][0].numpy().copy() for k in ("inputs_embeds", "trailing_text_hidden")})
        got["tts_pad"] = kwargs["tts_pad_embed"].reshape(-1).numpy().copy()
        raise _Captured

    input_ids = tts._tokenize_texts([tts._build_assistant_text(text)])
    ref_ids = [tts._tokenize_texts([tts._build_ref_text(item.ref_text)])[0]] if item.icl_mode else None
    original = model.talker.generate
    model.talker.generate = stop
    try:
        with pytest.raises(_Captured):
            model.generate(input_ids=input_ids, ref_ids=ref_ids,
                           voice_clone_prompt=tts._prompt_items_to_voice_clone_prompt([item]),
                           languages=[language], non_streaming_mode=non_streaming,
                           **tts._merge_generate_kwargs(do_sample=False, subtalker_dosample=False,
                                                        max_new_tokens=2))
    finally:
        model.talker.generate = original
    got["input_ids"] = input_ids[0][0].numpy()
    got["ref_ids"] = ref_ids[0][0].numpy() if ref_ids else None
    return got


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.float64) - b).max()) if a.size else 0.0


@pytest.mark.parametrize("text_key", list(TEXTS))
@pytest.mark.parametrize("language", ["Auto", "English"])
@pytest.mark.parametrize("mode", MODES)
def test_prompt_matches_reference(ref_model, exported, voice, variant, mode, language, text_key):
    icl = mode.startswith("icl")
    non_streaming = mode.endswith("nonstream")
    item = voice["icl" if icl else "xvec"]
    text = TEXTS[text_key]
    ref = capture(ref_model, item, text, language, non_streaming)

    tok: TextTokenizer = exported["tok"]
    input_ids = tok.assistant_ids(text)
    np.testing.assert_array_equal(input_ids, ref["input_ids"])
    ref_text_ids = tok.ref_ids(REF_TEXT) if icl else None
    if icl:
        np.testing.assert_array_equal(ref_text_ids, ref["ref_ids"])

    prompt = build_prompt(
        exported["tables"], input_ids, special_ids=exported["special_ids"],
        language_id=language_id(exported["languages"], language),
        speaker=item.ref_spk_embedding.numpy(), mode="icl" if icl else "xvector",
        non_streaming=non_streaming, ref_text_ids=ref_text_ids,
        ref_codes=item.ref_code.numpy() if icl else None)
    assert prompt.embeds.dtype == np.float32 and prompt.trailing.dtype == np.float32
    errs = {"embeds": _max_abs(prompt.embeds, ref["inputs_embeds"]),
            "trailing": _max_abs(prompt.trailing, ref["trailing_text_hidden"]),
            "tts_pad": _max_abs(prompt.tts_pad, ref["tts_pad"])}
    print(f"\n{variant} {mode} {language} {text_key}: T={len(prompt.embeds)} K={len(prompt.trailing)} "
          + " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    assert max(errs.values()) <= TOL, errs


def test_prompt_lengths_follow_reference_md(exported, voice):
    """An earlier C++ port's fixed sentence: 19 prefill positions for 8 text tokens (x-vector, non-streaming)."""
    tok, tables = exported["tok"], exported["tables"]
    ids = tok.assistant_ids("Hello world, this is a tiny test.")
    body = len(ids) - 8
    spk = voice["xvec"].ref_spk_embedding.numpy()
    kw = dict(special_ids=exported["special_ids"], speaker=spk, mode="xvector")
    p = build_prompt(tables, ids, language_id=2050, non_streaming=True, **kw)
    assert len(p.embeds) == 3 + 6 + body + 1 + 1 and len(p.trailing) == 1
    p = build_prompt(tables, ids, language_id=None, non_streaming=False, **kw)
    assert len(p.embeds) == 3 + 5 + 1 and len(p.trailing) == body


# ---------------------------------------------------------------- tables
def test_bf16_storage_is_exact(ref_model, exported):
    spec = exported["spec"]["text_embedding"]
    assert spec["dtype"] == "bf16" and spec["file"] == "embeddings/text_embedding.npy"
    raw = np.load(exported["dir"] / spec["file"], mmap_mode="r")
    assert raw.dtype == np.uint16 and list(raw.shape) == spec["shape"]
    want = ref_model.model.talker.model.text_embedding.weight.detach().numpy()
    np.testing.assert_array_equal(bf16_to_f32(raw), want)
    np.testing.assert_array_equal(exported["tables"].text_rows([0, 77091, 151671]), want[[0, 77091, 151671]])


def test_tables_match_model(ref_model, exported):
    m = ref_model.model.talker
    t: EmbeddingTables = exported["tables"]
    H = m.config.hidden_size
    spec = exported["spec"]
    assert set(spec) == {"text_embedding", "text_proj_fc1_w", "text_proj_fc1_b", "text_proj_fc2_w",
                         "text_proj_fc2_b", "codec_embedding", "cp_codec_embedding"}
    assert spec["codec_embedding"]["shape"] == [3072, H] and spec["codec_embedding"]["dtype"] == "fp32"
    assert spec["cp_codec_embedding"]["shape"] == [15, 2048, H]  # talker hidden, also for "proj"
    np.testing.assert_array_equal(t.codec([0, 2149, 3071]), m.get_input_embeddings().weight.detach().numpy()[[0, 2149, 3071]])
    rng = np.random.default_rng(1)
    codes = np.concatenate([[rng.integers(0, 2048)], rng.integers(0, 2048, 15)])
    with torch.no_grad():
        c = torch.as_tensor(codes)
        want = m.get_input_embeddings()(c[:1])[0] + sum(
            m.code_predictor.get_input_embeddings()[g - 1](c[g:g + 1])[0] for g in range(1, 16))
        np.testing.assert_allclose(t.codec_sum(codes), want.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(t.codec_sum(codes[None])[0], want.numpy(), rtol=0, atol=1e-6)
        ids = torch.tensor([151644, 77091, 198, 9707, 151671])
        want_t = m.text_projection(m.get_text_embeddings()(ids)).numpy()
    np.testing.assert_allclose(t.text(ids.numpy()), want_t, rtol=0, atol=1e-6)


def test_opening_tables_does_not_read_the_text_table(exported):
    t = EmbeddingTables(exported["dir"], exported["spec"], exported["special_ids"])
    assert isinstance(t.text_table, np.memmap)
    assert isinstance(t.codec_table, np.memmap) and isinstance(t.cp_codec_table, np.memmap)
    t.text([1, 2, 3])
    assert isinstance(t.text_table, np.memmap)


def test_fp16_fallback_warns(tmp_path, caplog):
    from kztts.export.common.embeddings import _write_text_table

    w = torch.randn(10, 4) / 3  # not bf16-representable
    (tmp_path / "embeddings").mkdir()
    with caplog.at_level(logging.WARNING, logger="kztts.export.common.embeddings"):
        spec = _write_text_table(w, tmp_path)
    assert spec["dtype"] == "fp16"
    assert "prompt accuracy is reduced" in caplog.text
    arr = np.load(tmp_path / spec["file"])
    assert arr.dtype == np.float16
    np.testing.assert_array_equal(arr, w.numpy().astype(np.float16))
    with pytest.raises(KzttsError, match="exceed the fp16 range"):
        _write_text_table(torch.full((3, 4), 1e6 + 1), tmp_path)


# ---------------------------------------------------------------- tokenizer
def test_tokenizer_matches_reference_processor(ref_model, exported):
    """Including strings where qwen-tts's fix_mistral_regex pre-tokenizer differs from Qwen's."""
    from kztts.export.common.tokenizer import CHECK_STRINGS

    tok = exported["tok"]
    for s in CHECK_STRINGS + ("iPhone", "JavaScript", TEXTS["long"]):
        want = ref_model.processor(text=s)["input_ids"][0]
        assert tok.encode(s).tolist() == list(want), s


def test_export_tokenizer_missing_files(tmp_path):
    from kztts.export.common.tokenizer import export_tokenizer

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    with pytest.raises(KzttsError, match=r"ckpt/tokenizer\.json .*missing"):
        export_tokenizer(ckpt, tmp_path / "out")


# ---------------------------------------------------------------- user errors
def test_empty_text_is_an_error(exported):
    tok = exported["tok"]
    for bad in ("", "   \n"):
        with pytest.raises(KzttsError, match="text is empty"):
            tok.assistant_ids(bad)
    with pytest.raises(KzttsError, match="reference text is empty"):
        tok.ref_ids("")
    with pytest.raises(KzttsError, match="text is empty"):
        build_prompt(exported["tables"], tok.encode("<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"),
                     special_ids=exported["special_ids"], language_id=None, speaker=None,
                     mode="xvector", non_streaming=False)


def test_unknown_language_lists_known_ones(exported):
    langs = exported["languages"]
    assert language_id(langs, None) is None and language_id(langs, "AUTO") is None
    assert language_id(langs, "English") == 2050
    with pytest.raises(KzttsError, match=r"unknown language 'klingon'; known: auto, chinese, english, "):
        language_id(langs, "klingon")
    with pytest.raises(KzttsError, match="unknown language"):
        language_id(langs, "sichuan_dialect")  # the Base wrapper rejects dialects too


def test_wrong_speaker_size(exported):
    t = exported["tables"]
    ids = exported["tok"].assistant_ids("Hi.")
    with pytest.raises(KzttsError, match=rf"speaker vector has shape \[7\]; this model expects {t.hidden} values"):
        build_prompt(t, ids, special_ids=exported["special_ids"], language_id=None,
                     speaker=np.zeros(7, np.float32), mode="xvector", non_streaming=False)


def test_icl_needs_reference(exported, voice):
    t, tok = exported["tables"], exported["tok"]
    ids = tok.assistant_ids("Hi.")
    kw = dict(special_ids=exported["special_ids"], language_id=None,
              speaker=voice["icl"].ref_spk_embedding.numpy(), mode="icl", non_streaming=False)
    with pytest.raises(KzttsError, match="reference text ids and the reference codes"):
        build_prompt(t, ids, **kw)
    with pytest.raises(KzttsError, match=r"reference codes must be \[frames > 0, 16\]"):
        build_prompt(t, ids, ref_text_ids=tok.ref_ids(REF_TEXT), ref_codes=np.zeros((3, 8), np.int64), **kw)
    with pytest.raises(KzttsError, match="unknown prompt mode"):
        build_prompt(t, ids, **{**kw, "mode": "clone"})
