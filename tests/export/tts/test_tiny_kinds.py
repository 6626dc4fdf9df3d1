"""The checkpoint kinds of ``kztts make-tiny --kind`` (``kztts.export.tts.tiny_configs``): the released CustomVoice
speakers and dialects, the size that decides the instruction, every width of the released 1.7B layout, the kinds
``kztts export`` accepts (``kztts.export.common.checkpoint``) and what it records (``kztts.export.tts.tts_parts``)."""
from __future__ import annotations

import json

import pytest

from kztts.core.errors import KzttsError
from kztts.export.common.checkpoint import read_config
from kztts.export.tts import tiny_configs


@pytest.mark.parametrize("kind", tiny_configs.KINDS)
def test_the_1_7b_layout_of_every_kind_has_the_released_widths(kind):
    cfg, _ = tiny_configs.make_configs("1.7b", kind=kind)
    tc, cp = cfg.talker_config, cfg.talker_config.code_predictor_config
    assert (cfg.tts_model_type, cfg.tts_model_size) == (kind, "1b7")
    assert (tc.hidden_size, tc.intermediate_size, tc.num_hidden_layers, tc.num_attention_heads,
            tc.num_key_value_heads, tc.head_dim, tc.text_hidden_size, tc.vocab_size) == \
        (2048, 6144, 28, 16, 8, 128, 2048, 3072)
    # the Code Predictor is 1024 wide behind the 2048 -> 1024 projection; x-vectors are Talker-wide
    assert (cp.hidden_size, cp.intermediate_size, cp.num_hidden_layers, cp.num_attention_heads,
            cp.num_key_value_heads, cp.head_dim) == (1024, 3072, 5, 16, 8, 128)
    assert cfg.speaker_encoder_config.enc_dim == 2048 and tc.rope_scaling["mrope_section"] == [24, 20, 20]
    assert bool(tc.spk_id) == (kind == "custom_voice")


def test_custom_voice_speakers_are_the_released_ones():
    cfg, _ = tiny_configs.make_configs("tiny", "equal", kind="custom_voice")
    tc = cfg.talker_config
    assert cfg.tts_model_size == "0b6"  # qwen-tts drops this size's instruction
    assert tc.spk_id["ryan"] == 3061 and tc.spk_id["serena"] == 3066 and len(tc.spk_id) == 9
    assert {k: v for k, v in tc.spk_is_dialect.items() if v} == {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
    assert all(2048 <= i < tc.vocab_size for i in tc.spk_id.values())  # rows of the codec embedding
    with pytest.raises(KzttsError, match="unknown checkpoint kind 'clone'"):
        tiny_configs.make_configs("tiny", kind="clone")


def test_export_reads_every_kind_and_refuses_an_incomplete_one(tmp_path, kind_dirs):
    for name in ("custom_voice", "voice_design"):
        assert read_config(kind_dirs[name])["tts_model_type"] in ("custom_voice", "voice_design")
    d = tmp_path / "m"
    (d / "speech_tokenizer").mkdir(parents=True)
    cfg = json.loads((kind_dirs["custom_voice"] / "config.json").read_text())
    for change, words in [(lambda c: c.update(tts_model_type="story"), "tts_model_type 'story' is not supported"),
                          (lambda c: c["talker_config"].update(spk_id={}), "without talker_config.spk_id speakers"),
                          (lambda c: c["talker_config"]["spk_is_dialect"].pop("eric"),
                           "spk_is_dialect lacks speakers eric")]:
        c = json.loads(json.dumps(cfg))
        change(c)
        (d / "config.json").write_text(json.dumps(c))
        with pytest.raises(KzttsError, match=words):
            read_config(d)


def test_tts_parts_record_the_kind(kind_dirs):
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.tts.tts_parts import kind_entries

    entries = kind_entries(load_reference(kind_dirs["custom_voice_06"]).model)
    assert entries["tts_model_size"] == "0b6" and entries["takes_instruction"] is False
    assert entries["speakers"]["dylan"] == {"id": 2878, "dialect": "beijing_dialect"}
