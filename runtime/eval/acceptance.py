"""The acceptance bounds of ``kztts validate`` and how a report is judged and printed.

One table per check: ``cpu`` (a bundle against qwen-tts, ``kztts validate``), ``htp-<precision>``
(the static graphs on the HTP against the CPU fp32 graphs, ``--target``), ``placement`` (a Talker layer
placement against the all-CPU fp32 Talker, ``--placement``; a quantized precision plan there: its least precise
member's ``htp-<precision>``); ``lm``: an LM bundle against transformers; ``lm-placement`` / ``lm-<precision>``
(w8a16, w4a16): an LM bundle on a target or under a placement against its fp32 CPU graphs. A bound is
``(op, value)`` with op ``<=`` or ``>=``. Every bound sits below (or above) the worst row measured good, by a
stated margin, and beyond what a known-bad build gave (docs/PRECISION.md, "Acceptance bounds").
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from kztts.bundle import graphs as G
from kztts.bundle.table_compact import PROJECTED_COS_MIN

Bound = tuple[str, float]

# The texts ``kztts validate --target`` speaks by default (``--text`` replaces them), each in its prompt mode
# (kztts.export.common.reference.MODES). None is a calibration prompt (kztts.export.tts.prompt_calibration,
# kztts/data/calibration_prompts.json), no mode is the one a calibration prompt with the same text has, and the
# voice differs too (VALIDATION_VOICE): the quantized graphs are judged on inputs they were not calibrated on
# (tests/eval/test_acceptance.py checks it). Four sequences of 16 frames give 68 Talker argmax rows, so one flip
# moves the score by 1.5%.
VALIDATION_PROMPTS: tuple[tuple[str, str], ...] = (
    ("A small boat drifted past the lighthouse just before dawn.", "xvec_nonstream"),
    ("Please read these three colours slowly: amber, violet and copper.", "icl_stream"),
    ("Every morning she cycles twelve kilometres to the old library.", "xvec_stream"),
    ("Could you pass me the salt, and then the pepper as well?", "icl_nonstream"),
)
VALIDATION_TEXTS: tuple[str, ...] = tuple(t for t, _ in VALIDATION_PROMPTS)
# The reference voice of the validation prompts (kztts.core.audio.synthetic_voice is the calibration's): a
# lower, faster-modulated tone, its x-vector and ICL codes unlike the calibration speaker's
VALIDATION_VOICE = {"f0": 132.0, "tremolo_hz": 5.0, "seconds": 1.2, "seed": 7}


def validation_voice(sr: int = 24000) -> np.ndarray:
    """The reference audio of the validation prompts (``VALIDATION_VOICE``): a voiced-like tone in light noise."""
    v = VALIDATION_VOICE
    t = np.arange(int(v["seconds"] * sr)) / sr
    rng = np.random.default_rng(int(v["seed"]))
    return (0.3 * np.sin(2 * np.pi * v["f0"] * t) * (1 + 0.5 * np.sin(2 * np.pi * v["tremolo_hz"] * t))
            + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)


MIN_ROWS = 50  # the rows each argmax-like score needs by default: one flip moves it by at most 2%

BOUNDS: dict[str, dict[str, Bound]] = {
    "cpu": {
        "prompt_max_abs": ("<=", 1e-5),
        "talker_logits_cos_min": (">=", 0.99999),
        "talker_hidden_cos_min": (">=", 0.99999),
        "talker_argmax_match": (">=", 1.0),
        "cp_codes_match": (">=", 1.0),
        "cp_logits_cos_min": (">=", 0.99999),
    },
    # A quantized CPU bundle (kztts export --weights int8|int4: MatMulNBits weights and compact tables) against
    # qwen-tts, `kztts validate B --reference M` (8 modes x 32 frames; the argmax-like scores over all 8 x 33
    # Talker rows and 8 x 32 frames, so one flip moves them by 0.4%). Good builds, tiny proj / equal / narrow /
    # mha: int8 prompt rows max |d| 5.2e-3..5.8e-3 (the text table's 8-bit rows), Talker logits cosine min
    # 0.99931..0.99959, argmax 0.970..0.996, CP codes 0.650..0.707, CP logits cosine min 0.9949..0.9987; int4
    # the same prompt rows, Talker 0.9369..0.9608, argmax 0.640..0.773, CP codes 0.094..0.110, CP cosine
    # 0.573..0.867. Bounds: 3.4x the worst prompt difference; int8 2.9x the worst cosine distance and 2.3x the
    # worst argmax shortfall; int4 2.1x the Talker's cosine distance and 1.4x its argmax shortfall, and for the
    # random Code Predictor at 4 bits (its codes agree ~10%) bounds that catch a broken graph, not a poor one.
    # Bad build: the int4 Talker's first down projection with its scales doubled, Talker cosine 0.852, argmax
    # 0.477 (tests/cli/test_validate_variants.py)
    "cpu-int8": {"prompt_max_abs": ("<=", 0.02), "talker_logits_cos_min": (">=", 0.998),
                 "talker_hidden_cos_min": (">=", 0.998), "talker_argmax_match_all": (">=", 0.93),
                 "cp_codes_match_all": (">=", 0.4), "cp_logits_cos_min": (">=", 0.98)},
    "cpu-int4": {"prompt_max_abs": ("<=", 0.02), "talker_logits_cos_min": (">=", 0.87),
                 "talker_hidden_cos_min": (">=", 0.87), "talker_argmax_match_all": (">=", 0.5),
                 "cp_codes_match_all": (">=", 0.04), "cp_logits_cos_min": (">=", 0.4)},
    # fp16 KV cache I/O (--kv fp16), weights fp32: Talker logits cosine 0.9999999+, argmax 1.0, CP codes pooled
    # 0.993..1.0 (near-ties flip in a mode: 0.973 there), CP cosine 0.9999996+
    "cpu-kv-fp16": {"prompt_max_abs": ("<=", 1e-5), "talker_logits_cos_min": (">=", 0.9999),
                    "talker_hidden_cos_min": (">=", 0.9999), "talker_argmax_match_all": (">=", 0.98),
                    "cp_codes_match_all": (">=", 0.95), "cp_logits_cos_min": (">=", 0.9999)},
    # fp16 on the HTP: the Talker measured 0.99999 on the tiny models; the Code Predictor on the validation prompts
    # (tiny proj): head argmax 0.99167, logits cosine min 0.99998 (greedy codes 0.9375: fp16 near-ties cascade, not
    # bounded); the bounds leave 6x the argmax shortfall and 50x the cosine distance
    "htp-fp16": {"talker_logits_cos_min": (">=", 0.999), "cp_argmax_match": (">=", 0.95),
                 "cp_logits_cos_min": (">=", 0.999)},
    # w8a16 Talker graphs (per-channel weights, float norms) on the simulator, tiny models (16 frames, four
    # prompt modes): logits cosine min 0.98924 (equal) and 0.99947 (proj), argmax 1.0 and 0.971; the
    # bound leaves about 4.5x the worst measured distance to 1 (0.0108 -> 0.95) and 3x the argmax
    # shortfall (0.03 -> 0.9). On the validation prompts (kztts validate --target's default, every graph on the HTP;
    # docs/PRECISION.md, "Acceptance bounds"), good builds of tiny proj / narrow; the margin from the worst of them:
    #   (the held-out mha shape: Talker 0.99509 / argmax 0.926, thin: 1.35x the shortfall; Code Predictor codes
    #   0.7625, head argmax 0.954, logits cosine 0.97571: 4.1x the distance)
    #   graph           metric               proj     narrow   bound  margin                 bad (one scale x2)
    #   Talker          logits cosine min    0.98586  0.99692  0.95   3.5x the distance to 1 0.9365 (narrow 0.9319)
    #                   argmax (68 rows)     0.985    0.971    0.9    3.4x the shortfall     0.632 (narrow 0.676)
    #   Code Predictor  codes (240)          0.6125   0.6875   0.3    half                   0.025 (narrow 0.042)
    #                   head argmax (240)    0.925    0.950    0.8    2.7x the shortfall     0.304 (narrow 0.354)
    #                   logits cosine min    0.98378  0.98968  0.9    6x the distance to 1   0.589 (narrow 0.638)
    #   decoder (fp16)  SNR, htp-decoder     46.90 dB 46.90 dB 40 dB  6.9 dB                 8.27 dB
    # The Code Predictor's greedy codes cascade (one early flip changes its frame's later codes): its head argmax,
    # teacher-forced on the HTP's own codes, counts independent rows
    "htp-w8a16": {"talker_logits_cos_min": (">=", 0.95), "talker_argmax_match": (">=", 0.9),
                  "cp_codes_match": (">=", 0.3), "cp_argmax_match": (">=", 0.8),
                  "cp_logits_cos_min": (">=", 0.9)},
    # w4a16 Talker graphs (int4 per column / LPBQ, float norms) on the simulator (16 frames, four prompt modes):
    # the tiny proj model cosine min 0.9700, argmax 0.735; the narrow model (widths 80 and 48 that no LPBQ block
    # divides, one KV head, bf16 weights; a prefill-only target) 0.9570, 0.559. Random Gaussian weights at 4 bits
    # lose ~19 dB per MatMul and their logits sit close: CPU int4 (MatMulNBits) gives the narrow model argmax
    # 0.79 too. The bound leaves 2.3x the worst distance to 1 (0.043 -> 0.1) and 1.35x the worst argmax
    # shortfall (0.441 -> 0.6). A mixed precision plan is bounded as its least precise member. On the validation
    # prompts, tiny proj / narrow: Talker 0.95795 / 0.9542, argmax 0.824 / 0.750; Code Predictor codes 0.0708 /
    # 0.0708, head argmax 0.4625 / 0.517, logits cosine min 0.81428 / 0.78835: a random-weight Code Predictor at 4
    # bits keeps about half its head argmaxes, so these bounds (0.03, 0.3, 0.7: 2.4x, 1.5x the worst shortfall, 1.4x
    # the worst distance) catch a broken graph, not a poor one
    "htp-w4a16": {"talker_logits_cos_min": (">=", 0.90), "talker_argmax_match": (">=", 0.4),
                  "cp_codes_match": (">=", 0.03), "cp_argmax_match": (">=", 0.3),
                  "cp_logits_cos_min": (">=", 0.7)},
    # the decoder on the HTP (fp16) vs the fp32 CPU decoder, when the target places it there: measured
    # 46.9 dB on the tiny model (tests/export/validate/test_decoder.py); 21 dB before SnakeBeta was folded
    "htp-decoder": {"decoder_snr_db": (">=", 40.0)},
    # the w8a16 decoder on the HTP (kztts export --decoder w8a16) vs the fp32 CPU decoder: measured 21.6 dB on the
    # tiny model over 5 and 10 frames of seeded random codes (tests/export/validate/test_decoder.py). The bound
    # leaves 3.6 dB (2.3x the noise power); one Conv's weight scales off by 2x gave 10.2-11.9 dB, by 1.25x 19.8 dB
    "htp-decoder-w8a16": {"decoder_snr_db": (">=", 18.0)},
    # the CPU decoder with its weights stored fp16 (kztts export --decoder fp16) vs the fp32 one, 10 frames of seeded
    # random codes (kztts.export.common.variants.decoder_check): good builds 56.0 dB (tiny) and 51.9 dB (0.6B
    # shape), so the bound is 11.9 dB under the worst; bad builds caught: the weights rounded to bf16 27.2 dB, one
    # convolution's weights doubled 21.8 dB (tiny; tests/export/common/test_variants.py). The same 40 dB as the
    # fp16 decoder on the HTP.
    "cpu-decoder-fp16": {"decoder_snr_db": (">=", 40.0)},
    # a device bundle's projected text rows (kztts pack) against the fp32 projection: the bound and its evidence are
    # kztts.bundle.table_compact.PROJECTED_COS_MIN's
    "packed-tables": {"text_rows_cos_min": (">=", PROJECTED_COS_MIN)},
    "placement": {"talker_logits_cos_min": (">=", 0.999)},
    # an LM bundle's CPU graphs against transformers (>= 0.9999 on the real 1.5B checkpoint)
    "lm": {"logits_cos_min": (">=", 0.9999), "greedy_match": (">=", 1.0)},
    # an LM bundle on a target / under a placement against its fp32 CPU graphs (as "placement")
    "lm-placement": {"logits_cos_min": (">=", 0.999)},
    # w8a16 LM graphs, measured on the real Qwen2.5-Coder-1.5B (240 positions): all-htp cosine min 0.9618,
    # top-1 0.954, perplexity 4.826 / fp32 4.648 = 1.038; prefill-htp-decode-cpu 0.9868, 0.971, 0.992.
    # ORT's QNN defaults (per-tensor weights, quantized norms) gave 0.292, 0.383, 67.38 / 4.648 = 14.5:
    # the bounds (a third of the good rows' worst cosine distance, about twice their top-1 shortfall
    # and perplexity rise) pass the good rows and fail that one on every metric
    "lm-w8a16": {"logits_cos_min": (">=", 0.95), "top1_agree": (">=", 0.90), "ppl_ratio": ("<=", 1.10)},
    # w4a16 LM graphs, measured on the real Qwen2.5-Coder-1.5B (240 positions, the QDQ graphs on the CPU EP:
    # benchmarks/precision_plan): all-htp cosine min 0.9226, top-1 0.850, perplexity 5.159 / 4.648 = 1.110 (CPU
    # int4 loses as much: 5.152). The bounds leave about twice that cosine distance, 1.7x the top-1 shortfall and
    # 2.3x the perplexity rise; the QNN-defaults build above fails them on every metric
    "lm-w4a16": {"logits_cos_min": (">=", 0.85), "top1_agree": (">=", 0.75), "ppl_ratio": ("<=", 1.25)},
}


def htp_bounds(report: dict) -> dict[str, Bound]:
    """The bounds of a ``validate --target`` report (``kztts.export.validate.htp``): its static graphs' precision's
    (a mixed report: the least precise's), and its decoder's when the decoder ran on the HTP."""
    precision = report["precision"]
    names = list(precision) if isinstance(precision, (list, tuple, set)) else [precision or G.FLOAT_HTP_PRECISION]
    bounds = dict(BOUNDS[G.htp_precision(G.least_precise(names)).bounds])
    if report.get("decoder_snr_db") is not None:
        bounds.update(BOUNDS[G.htp_precision(report["decoder_precision"]).decoder_bounds])
    return bounds


def within(value: float, bound: Bound) -> bool:
    """Whether ``value`` satisfies ``bound``."""
    op, limit = bound
    return value <= limit if op == "<=" else value >= limit


def judge(report: dict, bounds: dict[str, Bound]) -> bool:
    """Pass when every bounded metric of ``report`` is within its bound; stored as ``report["pass"]``, with the
    metrics judged in ``report["judged"]`` and those failing in ``report["failed"]``.

    A metric that ``report`` holds as None is not judged: a graph the target does not place on the HTP is not
    measured there (``kztts validate --target`` prints it as such). A bounded metric missing from ``report``
    altogether is a caller's mistake (KeyError)."""
    judged = {k: b for k, b in bounds.items() if report[k] is not None}
    report["judged"] = sorted(judged)
    report["failed"] = sorted(k for k, b in judged.items() if not within(report[k], b))
    report["pass"] = not report["failed"]
    return report["pass"]


def metric_lines(report: dict, keys: Iterable[str], bounds: dict[str, Bound], width: int = 26) -> list[str]:
    """One line per metric of ``keys`` that ``report`` has (not None): name, value and, when
    bounded, ``(op bound: ok|FAIL)``."""
    lines = []
    for k in keys:
        if report.get(k) is None:
            continue
        bound = bounds.get(k)
        note = f"  ({bound[0]} {bound[1]:g}: {'ok' if within(report[k], bound) else 'FAIL'})" if bound else ""
        lines.append(f"{k:<{width}}{report[k]:.7g}{note}")
    return lines
