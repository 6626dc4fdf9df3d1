"""Running the official qwen-tts model to produce what kztts is checked against.

``reference_run`` captures, for one prompt, exactly what qwen-tts's own
``generate`` builds and produces: the prefill embeddings, the trailing text
embeddings, the speaker x-vector, the ICL reference codes and the greedy codes.
``preset_run`` does the same through qwen-tts's own ``generate_custom_voice`` / ``generate_voice_design``
(one request or a batch of them), ``teacher_forced_talker`` replays the Talker on given codes (no sampling) and
returns the logits and final-norm hidden of every step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kztts.core.audio import synthetic_voice

MODES = ("xvec_stream", "xvec_nonstream", "icl_stream", "icl_nonstream")
DEFAULT_TEXT = "Hello world, this is a tiny test."
DEFAULT_REF_TEXT = "A reference sentence."


@dataclass
class ReferenceRun:
    mode: str
    language: str
    text: str
    ref_text: str | None
    input_ids: np.ndarray  # assistant-template token ids
    ref_ids: np.ndarray | None  # ref-template token ids (ICL)
    prefill: np.ndarray  # [T, H] as built by qwen-tts
    trailing: np.ndarray  # [K, H]
    tts_pad: np.ndarray  # [H]
    speaker: np.ndarray  # x-vector [enc_dim]
    ref_codes: np.ndarray | None  # [F_ref, 16] (ICL)
    codes: np.ndarray  # [F, 16] greedy codes from generate()
    # CustomVoice / VoiceDesign (``speaker`` is then the preset's codec row, or zeros for none):
    instruct_ids: np.ndarray | None = None  # the instruction template's ids, as qwen-tts tokenized it
    language_id: int | None = None  # the codec language id qwen-tts chose (a dialect speaker's remap)
    preset: str | None = None  # the preset speaker
    has_speaker: bool = True  # False: VoiceDesign (no speaker position)

    @property
    def xvector_mode(self) -> bool:
        return self.mode.startswith("xvec")

    @property
    def non_streaming(self) -> bool:
        return self.mode.endswith("nonstream")


def _capture_talker_generate(model):
    captured: dict = {}
    original = model.talker.generate

    def wrapped(*args, **kwargs):
        captured.update(prefill=kwargs["inputs_embeds"].clone(), trailing=kwargs["trailing_text_hidden"].clone(),
                        tts_pad=kwargs["tts_pad_embed"].clone(), mask=kwargs["attention_mask"].clone())
        return original(*args, **kwargs)

    model.talker.generate = wrapped
    return captured, lambda: setattr(model.talker, "generate", original)


@torch.no_grad()
def reference_run(tts, mode: str, *, frames: int, language: str = "English", text: str = DEFAULT_TEXT,
                  ref_text: str = DEFAULT_REF_TEXT, ref_audio: np.ndarray | None = None,
                  ref_sr: int = 24000) -> ReferenceRun:
    """Greedy qwen-tts generation of ``frames`` frames (fewer if EOS) with the prompt captured."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} not in {MODES}")
    if tts.model.tts_model_type != "base":
        return _kind_reference_run(tts, mode, frames=frames, language=language, text=text)
    xvec = mode.startswith("xvec")
    non_streaming = mode.endswith("nonstream")
    model = tts.model
    wav = synthetic_voice(sr=ref_sr) if ref_audio is None else ref_audio
    items = tts.create_voice_clone_prompt(ref_audio=(wav, ref_sr), ref_text=None if xvec else ref_text,
                                          x_vector_only_mode=xvec)
    vcp = tts._prompt_items_to_voice_clone_prompt(items)
    input_ids = tts._tokenize_texts([tts._build_assistant_text(text)])
    ref_ids = None if xvec else [tts._tokenize_texts([tts._build_ref_text(ref_text)])[0]]
    # temperature 1 (unused by argmax): transformers warns about a sampling flag set for greedy search
    greedy = dict(do_sample=False, subtalker_dosample=False, temperature=1.0, subtalker_temperature=1.0,
                  max_new_tokens=frames + 1)
    captured, restore = _capture_talker_generate(model)
    try:
        codes_list, _ = model.generate(input_ids=input_ids, ref_ids=ref_ids, voice_clone_prompt=vcp,
                                       languages=[language], non_streaming_mode=non_streaming,
                                       **tts._merge_generate_kwargs(**greedy))
    finally:
        restore()
    item = items[0]
    return ReferenceRun(
        mode=mode, language=language, text=text, ref_text=None if xvec else ref_text,
        input_ids=input_ids[0][0].numpy(), ref_ids=None if xvec else ref_ids[0][0].numpy(),
        prefill=captured["prefill"][0].numpy(), trailing=captured["trailing"][0].numpy(),
        tts_pad=captured["tts_pad"].reshape(-1).numpy(), speaker=item.ref_spk_embedding.numpy(),
        ref_codes=None if xvec else item.ref_code.numpy(), codes=codes_list[0].numpy(),
    )


VALIDATION_INSTRUCT = "Speak slowly and clearly, in a calm voice."


def kind_modes(tts, modes) -> tuple[str, ...]:
    """``modes`` as the checkpoint's kind runs them: all four for Base; for CustomVoice / VoiceDesign (no ICL) one
    per text mode (``_kind_reference_run``)."""
    if tts.model.tts_model_type == "base":
        return tuple(modes)
    seen: dict[bool, str] = {}
    for m in modes:
        seen.setdefault(m.endswith("nonstream"), m)
    return tuple(seen.values())


def _kind_reference_run(tts, mode: str, *, frames: int, language: str, text: str) -> ReferenceRun:
    """``reference_run`` of a CustomVoice / VoiceDesign checkpoint: its prompt is the x-vector layout, so a mode is
    its text mode (xvec or icl alike): a dialect speaker if it has one (else its first), with an instruction where
    the checkpoint takes one (VoiceDesign: always ``VALIDATION_INSTRUCT``)."""
    model = tts.model
    tc = model.config.talker_config
    request = {"text": text, "language": language}
    takes = model.tts_model_type == "voice_design" or not (model.tts_model_size in "0b6")
    if takes:
        request["instruct"] = VALIDATION_INSTRUCT
    preset = None
    if model.tts_model_type == "custom_voice":
        names = sorted(tc.spk_id)
        preset = next((n for n in names if tc.spk_is_dialect.get(n)), names[0])
        request["speaker"] = preset
    run = preset_run(tts, [request], frames=frames, non_streaming=mode.endswith("nonstream"))[0]
    input_ids = tts._tokenize_texts([tts._build_assistant_text(text)])[0][0].numpy()
    instruct_ids = tts._tokenize_texts([tts._build_instruct_text(VALIDATION_INSTRUCT)])[0][0].numpy() if takes else None
    hidden = model.talker.get_input_embeddings().weight.shape[1]
    speaker = (model.talker.get_input_embeddings().weight[int(tc.spk_id[preset])].detach().numpy().copy()
               if preset else np.zeros(hidden, np.float32))
    lid = None if language.lower() == "auto" else int(tc.codec_language_id[language.lower()])
    if preset and tc.spk_is_dialect.get(preset) and language.lower() in ("chinese", "auto"):
        lid = int(tc.codec_language_id[tc.spk_is_dialect[preset]])
    return ReferenceRun(mode=mode, language=language, text=text, ref_text=None, input_ids=input_ids, ref_ids=None,
                        prefill=run.prefill, trailing=run.trailing, tts_pad=run.tts_pad, speaker=speaker,
                        ref_codes=None, codes=run.codes, instruct_ids=instruct_ids, language_id=lid, preset=preset,
                        has_speaker=preset is not None)


@dataclass
class PresetRun:
    """One request of a CustomVoice / VoiceDesign reference run and what qwen-tts made of it."""

    text: str
    language: str
    speaker: str | None  # CustomVoice
    instruct: str | None
    non_streaming: bool
    prefill: np.ndarray  # [T, H] (its row of the left-padded batch, padding removed)
    trailing: np.ndarray  # [K, H] (padded with tts_pad to the batch's longest)
    tts_pad: np.ndarray  # [H]
    codes: np.ndarray  # [F, 16] greedy codes


@torch.no_grad()
def preset_run(tts, requests: list[dict], *, frames: int, non_streaming: bool = True) -> list[PresetRun]:
    """Greedy qwen-tts generation of ``frames`` frames for each request ({text, language, speaker?, instruct?}),
    all in one call of the wrapper the checkpoint's kind has: ``generate_custom_voice`` (speakers) or
    ``generate_voice_design``; the wrapper decides what reaches ``generate`` (it drops a 0.6B instruction)."""
    model = tts.model
    captured, restore = _capture_talker_generate(model)
    codes_out: list = []
    original = model.generate

    def generate(*args, **kwargs):
        codes_list, hidden = original(*args, **kwargs)
        codes_out.extend(c.clone() for c in codes_list)
        return codes_list, hidden

    model.generate = generate
    greedy = dict(do_sample=False, subtalker_dosample=False, temperature=1.0, subtalker_temperature=1.0,
                  max_new_tokens=frames + 1)
    texts = [r["text"] for r in requests]
    languages = [r.get("language") or "Auto" for r in requests]
    instructs = [r.get("instruct") or "" for r in requests]
    try:
        if model.tts_model_type == "custom_voice":
            tts.generate_custom_voice(texts, [r["speaker"] for r in requests], languages, instructs,
                                      non_streaming_mode=non_streaming, **greedy)
        else:
            tts.generate_voice_design(texts, instructs, languages, non_streaming_mode=non_streaming, **greedy)
    finally:
        restore()
        model.generate = original
    mask = captured.get("mask")
    runs = []
    for i, r in enumerate(requests):
        prefill = captured["prefill"][i].numpy()
        if mask is not None:
            prefill = prefill[mask[i].numpy().astype(bool)]
        runs.append(PresetRun(text=r["text"], language=languages[i], speaker=r.get("speaker"),
                              instruct=r.get("instruct"), non_streaming=non_streaming, prefill=prefill,
                              trailing=captured["trailing"][i].numpy(),
                              tts_pad=captured["tts_pad"].reshape(-1).numpy(), codes=codes_out[i].numpy()))
    return runs


@torch.no_grad()
def codec_input(model, codes: np.ndarray) -> torch.Tensor:
    """Next talker input from one frame's 16 codes: C(c0) + sum_g cp.codec_embedding[g-1](c_g)."""
    talker = model.talker
    c = torch.as_tensor(codes, dtype=torch.long)
    e = talker.get_input_embeddings()(c[:1])
    for g in range(1, len(codes)):
        e = e + talker.code_predictor.get_input_embeddings()[g - 1](c[g:g + 1])
    return e[0]


@torch.no_grad()
def teacher_forced_talker(model, prefill: np.ndarray, trailing: np.ndarray, tts_pad: np.ndarray,
                          codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Logits [F+1, V] and hidden [F+1, H]: step 0 after the prefill, step k after feeding frame k-1."""
    from transformers.cache_utils import DynamicCache

    talker = model.talker
    cache = DynamicCache()
    x = torch.as_tensor(prefill)[None]
    n = x.shape[1]
    pos = torch.arange(n).view(1, 1, n).expand(3, 1, n)
    h = talker.model(inputs_embeds=x, position_ids=pos, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
    logits, hidden = [talker.codec_head(h)[0]], [h[0]]
    pad = torch.as_tensor(tts_pad)
    for k, frame in enumerate(codes):
        e = codec_input(model, frame) + (torch.as_tensor(trailing[k]) if k < len(trailing) else pad)
        p = n + k
        out = talker.model(inputs_embeds=e.view(1, 1, -1), position_ids=torch.full((3, 1, 1), p),
                           past_key_values=cache, use_cache=True)
        h = out.last_hidden_state[:, -1]
        logits.append(talker.codec_head(h)[0])
        hidden.append(h[0])
    return torch.stack(logits).numpy(), torch.stack(hidden).numpy()


@torch.no_grad()
def teacher_forced_code_predictor(model, hidden: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Teacher-forced logits [F, 15, V] of the reference Code Predictor, all frames in one batch.

    qwen-tts's own ``forward_sub_talker_finetune``: one causal pass over [h, C(c0), E_1(c1), ...,
    E_14(c14)], head g on position g + 1; the same modules and weights that generate() runs
    step by step with a KV cache, with 15x fewer Python calls."""
    logits, _ = model.talker.forward_sub_talker_finetune(torch.as_tensor(codes, dtype=torch.long),
                                                         torch.as_tensor(hidden, dtype=torch.float32))
    return logits.numpy()
