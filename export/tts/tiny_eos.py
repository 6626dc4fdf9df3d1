"""The EOS wiring of a tiny checkpoint built with ``eos_bias`` (``kztts.export.tts.tiny_build``): a model that
stops by itself, to test the stop path.

``eos_bias``
------------
A random model never emits EOS. ``eos_bias=b`` (``True`` means ``EOS_BIAS_DEFAULT``; a
model meant to test the stop path)
wires a clean "share of the context that is generated audio" feature into the talker
(``install_eos_counter_``): one hidden channel marks the codec embeddings of the audio
codes 0..2047, head 0 of layer 0 attends uniformly (zero query) and copies that marker
into a second channel, which no other weight reads or writes, and the codec-head row
of ``codec_eos_token_id`` (2150) reads only that channel. The row is scaled
(calibrated on a fixed prompt) so that at decode frame t after an L-position prompt

    EOS logit ~= b * t / (L + t)     (within ~10 %)

while the best competing logit of the sharpened random head is ~25-30 at every size.
Greedy decoding therefore stops by EOS after t ~= L * 27 / (b - 27) frames: longer
prompts stop later, like a real model. Measured with ``EOS_BIAS_DEFAULT`` = 80 on the
tiny models (both variants, seeds 1, 2, 3, 1234; ``generate_voice_clone`` x-vector,
greedy): a 9-token sentence stops after 3-7 frames in streaming mode (prompt of 10
positions), a 10-token one after 8-12 frames in non-streaming mode, a 20-token one after
12-18. b = 100 stops ~1.5x sooner, b = 60 ~1.5x later. In ICL mode the reference codes
are audio codes too, so the counter starts high and EOS comes at the first allowed frame
or soon after. Models built without ``eos_bias`` contain none of this.
"""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import torch

from kztts.export.tts.tiny_configs import ASSISTANT_TOKEN_ID, TinyConfigError
from kztts.export.tts.tiny_weights import round4

logger = logging.getLogger(__name__)

# Recommended eos_bias for a model meant to exercise the stop path (see module docstring).
EOS_BIAS_DEFAULT = 80.0


def resolve_eos_bias(eos_bias) -> Optional[float]:
    """None/False -> None (no EOS wiring); True -> ``EOS_BIAS_DEFAULT``; a number -> float."""
    if eos_bias is None or eos_bias is False:
        return None
    if eos_bias is True:
        return EOS_BIAS_DEFAULT
    try:
        return float(eos_bias)
    except (TypeError, ValueError):
        raise TinyConfigError(f"eos_bias must be a number or True, not {eos_bias!r}") from None


def reference_wav(seconds: float = 1.3, sr: int = 24000) -> np.ndarray:
    """A synthetic 'voice': 180 Hz tone, 3 Hz tremolo, light noise (fixed seed)."""
    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


def _calibration_prompt(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill embeddings of a fixed x-vector, non-streaming prompt (docs/QWEN3_TTS.md, talker
    prompt), the x-vector taken from ``reference_wav()``."""
    tk = model.talker
    tc = model.config.talker_config
    cfg = model.config

    def text(ids):
        return tk.text_projection(tk.get_text_embeddings()(torch.tensor([ids])))

    def codec(ids):
        return tk.get_input_embeddings()(torch.tensor([ids]))

    body = [9707, 1879, 11, 419, 374, 264, 13673, 1273, 13]  # "Hello world, this is a tiny test."
    role = text([cfg.im_start_token_id, ASSISTANT_TOKEN_ID, 198])
    pad, bos, eos = (text([i]) for i in (cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id))
    prefix = [tc.codec_think_id, tc.codec_think_bos_id, tc.codec_language_id["english"], tc.codec_think_eos_id]
    spk = model.extract_speaker_embedding(reference_wav(), 24000).view(1, 1, -1).clone()
    codec_prefix = torch.cat([codec(prefix), spk, codec([tc.codec_pad_id])], dim=1)
    n = codec_prefix.shape[1]
    text_part = torch.cat([pad.expand(1, n - 1, -1), bos], dim=1)
    body_part = torch.cat([text(body), eos], dim=1) + codec([tc.codec_pad_id])
    last = pad + codec([tc.codec_bos_id])
    prefill = torch.cat([role, text_part + codec_prefix, body_part, last], dim=1)
    return prefill, pad


@torch.no_grad()
def _greedy_talker_trace(model, prefill: torch.Tensor, tts_pad: torch.Tensor, frames: int,
                         repetition_penalty: float = 1.05):
    """Greedy talker + code predictor (the decode loop of docs/QWEN3_TTS.md), EOS disabled.
    Returns the final-norm hiddens [frames, H] and the best allowed non-EOS logit per frame."""
    from transformers.cache_utils import DynamicCache

    tk = model.talker
    tc = model.config.talker_config
    cp = tk.code_predictor
    V, eos = tc.vocab_size, tc.codec_eos_token_id
    cache = DynamicCache()
    L = prefill.shape[1]
    pos = torch.arange(L).view(1, 1, L).expand(3, 1, L)
    h = tk.model(inputs_embeds=prefill, position_ids=pos, past_key_values=cache,
                 use_cache=True).last_hidden_state[:, -1:]
    hiddens, best, generated = [], [], []
    for step in range(frames):
        s = tk.codec_head(h)[0, -1].clone()
        if generated:
            idx = torch.tensor(sorted(set(generated)))
            v = s[idx]
            s[idx] = torch.where(v < 0, v * repetition_penalty, v / repetition_penalty)
        s[V - 1024:] = -float("inf")  # suppressed control ids, and EOS itself
        tok = int(torch.argmax(s))
        hiddens.append(h[0, 0].clone())
        best.append(float(s[tok]))
        generated.append(tok)
        e0 = tk.get_input_embeddings()(torch.tensor([[tok]]))
        cp_cache = DynamicCache()
        o = cp.model(inputs_embeds=cp.small_to_mtp_projection(torch.cat([h, e0], dim=1)),
                     past_key_values=cp_cache, use_cache=True)
        e = e0
        for gi in range(1, 16):
            c = int(torch.argmax(cp.lm_head[gi - 1](o.last_hidden_state[:, -1])[0]))
            emb = cp.model.codec_embedding[gi - 1](torch.tensor([[c]]))
            e = e + emb
            if gi < 15:
                o = cp.model(inputs_embeds=cp.small_to_mtp_projection(emb), past_key_values=cp_cache,
                             use_cache=True)
        h = tk.model(inputs_embeds=e + tts_pad, position_ids=torch.full((3, 1, 1), L + step),
                     past_key_values=cache, use_cache=True).last_hidden_state[:, -1:]
    return torch.stack(hiddens), torch.tensor(best)


def _eos_channels(model) -> tuple[int, int]:
    H = model.config.talker_config.hidden_size
    return H - 1, H - 2  # (marker, counter)


@torch.no_grad()
def install_eos_counter_(model) -> None:
    """Wire a clean "frames generated so far" feature into the talker (see the module docstring).

    Channel ``m`` (marker) is 1 in the talker codec embedding of every audio code
    0..2047 and 0 in every other input (control codec ids, text projection, x-vector,
    code-predictor embeddings). Channel ``n`` (counter) is written only by head 0 of
    layer 0, whose query is zero (uniform causal attention) and whose value dim 0 reads
    channel ``m``: at every later position ``n`` holds the fraction of the context that
    is audio codes. No other weight reads or writes ``m`` or ``n``; the codec head
    reads ``n`` only in the EOS row, which reads nothing else."""
    tk = model.talker
    tc = model.config.talker_config
    m, n = _eos_channels(model)
    both = [m, n]
    emb = tk.model.codec_embedding.weight
    emb[:, both] = 0.0
    emb[:2048, m] = 1.0
    for e in tk.code_predictor.model.codec_embedding:
        e.weight[:, both] = 0.0
    fc2 = tk.text_projection.linear_fc2
    fc2.weight[both] = 0.0
    if fc2.bias is not None:
        fc2.bias[both] = 0.0
    if getattr(model, "speaker_encoder", None) is not None:
        model.speaker_encoder.fc.weight[both] = 0.0
        if model.speaker_encoder.fc.bias is not None:
            model.speaker_encoder.fc.bias[both] = 0.0
    for layer in tk.model.layers:
        a, f = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, f.gate_proj, f.up_proj):
            lin.weight[:, both] = 0.0
        for lin in (a.o_proj, f.down_proj):
            lin.weight[both] = 0.0
    a = tk.model.layers[0].self_attn
    hd = tc.head_dim
    a.q_proj.weight[:hd] = 0.0        # head 0: q = 0 -> equal scores -> mean over the causal context
    a.v_proj.weight[0] = 0.0          # kv head 0, dim 0 = marker channel
    a.v_proj.weight[0, m] = 1.0
    a.o_proj.weight[n, 0] = 1.0       # head 0 dim 0 -> counter channel
    head = tk.codec_head.weight
    head[:, both] = 0.0
    head[tc.codec_eos_token_id] = 0.0


@torch.no_grad()
def apply_eos_bias_(model, eos_bias: float, frames: int = 24) -> dict:
    """Install the EOS counter and scale the EOS row so its logit is ~``eos_bias * t / (L + t)``
    at frame t after an L-position prompt (calibrated on a fixed prompt). Returns stats."""
    tc = model.config.talker_config
    install_eos_counter_(model)
    _, n = _eos_channels(model)
    prefill, pad = _calibration_prompt(model)
    L = prefill.shape[1]
    hid, best = _greedy_talker_trace(model, prefill, pad, frames)
    t = torch.arange(frames, dtype=torch.float32)
    frac = t / (L + t)                        # share of audio-code positions in the context
    gain = float((hid[1:, n] / frac[1:]).median())
    w = round4(float(eos_bias) / gain)
    model.talker.codec_head.weight[tc.codec_eos_token_id, n] = w
    eos_logit = w * hid[:, n]
    first = next((k for k in range(2, frames) if eos_logit[k] > best[k]), None)
    stats = dict(eos_bias=float(eos_bias), eos_weight=w, calibration_prompt_len=L,
                 calibration_first_eos_frame=first,
                 gain_spread=float((hid[1:, n] / frac[1:]).std() / gain))
    logger.info("eos_bias %g: EOS weight %.4g; the calibration prompt (%d positions) stops at frame %s",
                eos_bias, w, L, first)
    return stats
