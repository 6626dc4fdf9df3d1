"""What a TTS bundle's manifest holds of the model besides its graphs: the shapes and ids the runtime sizes its
buffers and prompts by (``model_config``, manifest ``config``), the special text and codec ids
(``special_ids``) and what the checkpoint's kind accepts (``kind_entries``: preset speakers, instruction). An LM bundle's counterpart is ``kztts.export.lm.lm_parts``."""
from __future__ import annotations

from torch import nn

from kztts.export.graphs.talker_graph import TalkerGraph


def model_config(model) -> dict:
    """The shapes and ids the runtime needs, from a loaded Qwen3TTSForConditionalGeneration."""
    tc = model.config.talker_config
    cpc = tc.code_predictor_config
    talker = TalkerGraph(model.talker).shape
    cp_head_dim = getattr(cpc, "head_dim", cpc.hidden_size // cpc.num_attention_heads)
    return {
        "talker": {
            "num_layers": talker.num_layers, "hidden": talker.hidden, "num_heads": talker.num_heads,
            "num_kv_heads": talker.num_kv_heads, "head_dim": talker.head_dim,
            "rope_theta": talker.rope_theta, "vocab": talker.vocab,
            "max_positions": tc.max_position_embeddings, "text_hidden": tc.text_hidden_size,
            "text_vocab": tc.text_vocab_size, "num_code_groups": tc.num_code_groups,
            "rms_norm_eps": tc.rms_norm_eps,
        },
        "code_predictor": {
            "num_layers": cpc.num_hidden_layers, "hidden": cpc.hidden_size,
            "num_heads": cpc.num_attention_heads, "num_kv_heads": cpc.num_key_value_heads,
            "head_dim": cp_head_dim, "rope_theta": float(cpc.rope_theta), "vocab": cpc.vocab_size,
            "num_code_groups": cpc.num_code_groups,
            "has_projection": not isinstance(model.talker.code_predictor.small_to_mtp_projection, nn.Identity),
        },
        "speaker_embedding_size": model.config.speaker_encoder_config.enc_dim,
        "sample_rate": 24000,
        "samples_per_frame": 1920,
    }


def special_ids(model) -> dict:
    """The text and codec ids the prompts are built from (names as the manifest's ``special_ids``)."""
    c, tc = model.config, model.config.talker_config
    return {
        "im_start": c.im_start_token_id, "im_end": c.im_end_token_id, "assistant": c.assistant_token_id,
        "tts_pad": c.tts_pad_token_id, "tts_bos": c.tts_bos_token_id, "tts_eos": c.tts_eos_token_id,
        "codec_pad": tc.codec_pad_id, "codec_bos": tc.codec_bos_id, "codec_eos": tc.codec_eos_token_id,
        "codec_think": tc.codec_think_id, "codec_nothink": tc.codec_nothink_id,
        "codec_think_bos": tc.codec_think_bos_id, "codec_think_eos": tc.codec_think_eos_id,
    }


def kind_entries(model) -> dict:
    """The manifest keys of the checkpoint's kind: ``tts_model_size``, ``speakers`` {name: {id, dialect}} (a
    CustomVoice checkpoint's presets; a dialect speaker's dialect is a ``languages`` key, else None) and
    ``takes_instruction``: as qwen-tts 0.1.1 decides, VoiceDesign always, CustomVoice unless its size is 0.6B
    (``generate_custom_voice`` sets the instruction to None when ``tts_model_size in "0b6"``), Base never
    (``generate_voice_clone`` has no instruction)."""
    c, tc = model.config, model.config.talker_config
    kind, size = c.tts_model_type, c.tts_model_size
    speakers = {}
    if kind == "custom_voice":
        dialects = tc.spk_is_dialect or {}
        speakers = {str(name).lower(): {"id": int(i), "dialect": dialects.get(name) or None}
                    for name, i in sorted((tc.spk_id or {}).items())}
    takes = kind == "voice_design" or (kind == "custom_voice" and not (size is not None and size in "0b6"))
    return {"tts_model_size": size, "speakers": speakers, "takes_instruction": bool(takes)}
