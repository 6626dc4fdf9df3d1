"""The reference row of ``kztts bench``: qwen-tts PyTorch, in its own process.

``python -m kztts.export.tts.bench_reference SPEC.json``. Same checkpoint, same text, language and
x-vector as the kztts rows, greedy (``do_sample=False``, ``subtalker_dosample=False``), the same
frame count with EOS blocked (``min_new_tokens`` raised to the frame count), the same threads
(``torch.set_num_threads``). Timing comes from wrappers around qwen-tts's own calls inside
``generate``: every ``talker.forward`` (the first is the prefill; a decode step's forward
runs ``code_predictor.generate`` first, whose time is split off) and
``speech_tokenizer.decode`` for the audio. The timed run uses the attention a user gets
(qwen-tts passes no ``attn_implementation``: transformers' default, sdpa; ``spec["attention"]``
overrides it), recorded as ``attention``. Accuracy against the fp32 kztts baseline, with eager
attention (the validator's, for numerics; ``accuracy_attention``): greedy codes, teacher-forced
Talker and Code Predictor logits on the baseline's codes, and the reference decoder's audio.
"""
from __future__ import annotations

import functools
import logging
import sys
import time

import numpy as np
import torch

from kztts.core import metrics
from kztts.core.worker_process import serve_runs, worker_main
from kztts.export.common.checkpoint import load_reference
from kztts.export.common.reference import teacher_forced_code_predictor, teacher_forced_talker

log = logging.getLogger(__name__)


def _wrap(obj, name: str, sink: list[float], inner: list[float] | None = None, split: list[float] | None = None):
    """Time every call of ``obj.name``; with ``inner``, also record how much of it was spent in
    calls logged to ``inner`` during it (``split``)."""
    fn = getattr(obj, name)

    @functools.wraps(fn)  # generate() inspects forward's signature to validate its kwargs
    def wrapper(*args, **kwargs):
        before = sum(inner) if inner is not None else 0.0
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        sink.append(time.perf_counter() - t)
        if split is not None:
            split.append(sum(inner) - before)
        return out

    setattr(obj, name, wrapper)
    return fn


ACCURACY_ATTENTION = "eager"


def _setup(spec: dict):
    """(qwen-tts wrapper, ``generate(n) -> (codes [n, 16] tensor, seconds)``, captured prompt
    tensors) for the spec's text, language and x-vector, greedy, EOS blocked for n frames.
    Loaded with the attention a user gets (qwen-tts passes none: transformers' default, sdpa)
    unless ``spec["attention"]`` names one."""
    tts = load_reference(spec["model_dir"], attention=spec.get("attention"))  # qwen_tts via the torchaudio shim
    from qwen_tts.inference.qwen3_tts_model import VoiceClonePromptItem

    model = tts.model
    xvec = torch.from_numpy(np.load(spec["xvector"]).astype(np.float32).reshape(-1))
    item = VoiceClonePromptItem(ref_code=None, ref_spk_embedding=xvec, x_vector_only_mode=True, icl_mode=False)
    vcp = tts._prompt_items_to_voice_clone_prompt([item])
    input_ids = tts._tokenize_texts([tts._build_assistant_text(spec["text"])])
    language = spec.get("language") or "Auto"
    captured: dict = {}
    original_generate = model.talker.generate

    def talker_generate(*args, **kwargs):
        kwargs["min_new_tokens"] = kwargs["max_new_tokens"]  # EOS blocked: every run makes the same frames
        captured.update(prefill=kwargs["inputs_embeds"].clone(), trailing=kwargs["trailing_text_hidden"].clone(),
                        tts_pad=kwargs["tts_pad_embed"].clone())
        return original_generate(*args, **kwargs)

    model.talker.generate = talker_generate

    def generate(n: int):
        kw = tts._merge_generate_kwargs(do_sample=False, subtalker_dosample=False, max_new_tokens=n + 1)
        t = time.perf_counter()
        codes, _ = model.generate(input_ids=input_ids, voice_clone_prompt=vcp, languages=[language],
                                  non_streaming_mode=True, **kw)
        return codes[0], time.perf_counter() - t

    return tts, generate, captured


@torch.no_grad()
def serve(spec: dict) -> int:
    """The qwen-tts side of the bench's end-to-end row (``kztts.bench.e2e``): per run, generate
    ``spec["frames"]`` frames, decode them (``speech_tokenizer.decode``) and write the WAV file."""
    import soundfile as sf


    torch.set_num_threads(int(spec["threads"]))
    tts, generate, _ = _setup(spec)
    wav = spec["wav"].format(side="reference")

    def run_once() -> dict:
        t = time.perf_counter()
        codes, _ = generate(int(spec["frames"]))
        wavs, sr = tts.model.speech_tokenizer.decode([{"audio_codes": codes}])
        sf.write(wav, np.clip(wavs[0], -1.0, 1.0), int(sr), subtype="PCM_16")
        return {"s": time.perf_counter() - t, "frames": int(len(codes))}

    return serve_runs(run_once, {"attention": attention_of(tts.model)})


def attention_of(model) -> str:
    """The attention implementation the Talker runs (transformers' ``_attn_implementation``)."""
    return str(model.talker.config._attn_implementation)


@torch.no_grad()
def run(spec: dict) -> dict:
    torch.set_num_threads(int(spec["threads"]))
    tts, generate, captured = _setup(spec)
    model = tts.model
    timed_attention = attention_of(model)
    frames, warmup = int(spec["frames"]), int(spec["warmup"])
    talker, cp = model.talker, model.talker.code_predictor
    fwd, cp_times, cp_in_fwd = [], [], []
    _wrap(cp, "generate", cp_times)
    _wrap(talker, "forward", fwd, inner=cp_times, split=cp_in_fwd)

    generate(max(warmup, 1))
    fwd.clear(), cp_times.clear(), cp_in_fwd.clear()
    codes_t, gen_s = generate(frames)
    codes = codes_t.numpy()
    talker_s = [f - c for f, c in zip(fwd[1:], cp_in_fwd[1:])]
    t = time.perf_counter()
    wavs, _ = model.speech_tokenizer.decode([{"audio_codes": codes_t}])
    dec_s = time.perf_counter() - t
    peak = metrics.peak_rss_mb()
    row = {
        "prefill_ms": round(fwd[0] * 1e3, 3),
        "prefill_positions": int(captured["prefill"].shape[1]),
        "talker_ms": metrics.median_ms(talker_s, warmup),
        "cp_ms": metrics.median_ms(cp_times, warmup),
        "decoder_ms": round(dec_s * 1e3 / max(len(codes), 1), 3),
        "ttfa_ms": None,  # qwen-tts 0.1.1 has no streaming decode
        "wall_s": round(gen_s + dec_s, 3),
        "audio_s": round(len(wavs[0]) / 24000, 3),
        "peak_rss_mb": peak,
        "runs_per_frame": None,
        "frames": int(len(codes)),
    }
    row["rtf"] = round(row["wall_s"] / row["audio_s"], 4) if row["audio_s"] else None
    row["frame_ms"] = round(row["talker_ms"] + row["cp_ms"] + row["decoder_ms"], 3)
    row["frame_rtf"] = round(row["frame_ms"] / 80.0, 4)
    row["times_ms"] = {"talker": [round(x * 1e3, 3) for x in talker_s], "code_predictor": [round(x * 1e3, 3) for x in cp_times]}

    row.update(attention=timed_attention, accuracy_attention=ACCURACY_ATTENTION)
    model.set_attn_implementation(ACCURACY_ATTENTION)
    base = dict(np.load(spec["baseline"]))
    g = base["codes"]
    tf_logits, _ = teacher_forced_talker(model, captured["prefill"][0].numpy(), captured["trailing"][0].numpy(),
                                         captured["tts_pad"].reshape(-1).numpy(), g[:-1])
    tf_cp = teacher_forced_code_predictor(model, base["talker_hidden"], g)
    wav_g, _ = model.speech_tokenizer.decode([{"audio_codes": torch.as_tensor(g)}])
    row.update(metrics.accuracy(codes, tf_logits, tf_cp, wav_g[0], wavs[0], base))
    return row


def main(argv: list[str] | None = None) -> int:
    """``SPEC.json``: the reference row (``run``); ``--serve SPEC.json``: the end-to-end server."""
    import json
    from pathlib import Path


    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(json.loads(Path(argv[1]).read_text()))
    return worker_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
