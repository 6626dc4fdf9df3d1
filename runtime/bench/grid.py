"""The configurations ``kztts bench`` runs: the cross product of the requested axes.

Execution targets (``--target``): ``cpu`` is the timed CPU grid (:class:`Config`); any other
value names a qnn_configs target whose static graphs run on the HTP simulator of
onnxruntime-qnn, one untimed accuracy row per HTP precision (:class:`HtpConfig`)."""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.core.env import check_threads
from kztts.core.errors import KzttsError
from kztts.htp.targets import load_target

AXES = {  # axis -> its list in the graph registry (read at parse time: a new entry there is a new choice)
    "weights": "CPU_WEIGHT_PRECISIONS",
    "kv": "KV_PRECISIONS",
    "cp_mode": "CP_MODES",
    "decoder": "DECODER_PRECISIONS",
    "attention": "ATTENTIONS",  # CPU graphs: talker_gqa/cp_frame_gqa, or the plain talker/cp_frame
}


@dataclass(frozen=True)
class Config:
    """One row of the grid (CPU execution provider)."""

    weights: str = "fp32"
    kv: str = "fp32"
    cp_mode: str = "frame"
    decoder: str = "fp32"
    threads: int = 2
    spin: bool = False  # ONNX Runtime worker threads spin between operators (SessionConfig.spinning)
    attention: str = "fused"  # kztts.plan.resolve attention of the worker
    pipeline: bool = False  # decoder on a background thread with 1 intra-op thread (TTS(pipeline=True))

    @property
    def name(self) -> str:
        return (f"{self.weights}/kv-{self.kv}/cp-{self.cp_mode}/dec-{self.decoder}/t{self.threads}"
                + ("/spin" if self.spin else "") + ("/plain-attn" if self.attention == "plain" else "")
                + ("/pipe" if self.pipeline else ""))

    @property
    def slug(self) -> str:
        return self.name.replace("/", "_")

    def as_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


def parse_list(raw: str, axis: str) -> list[str]:
    values = [v.strip() for v in raw.split(",") if v.strip()]
    allowed = getattr(G, AXES[axis])
    bad = [v for v in values if v not in allowed]
    if not values or bad:
        raise KzttsError(f"--{axis.replace('_', '-')} {raw!r}: choose from {', '.join(allowed)} (comma-separated)")
    return values


def parse_threads(raw: str) -> list[int]:
    try:
        values = [int(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise KzttsError(f"--threads {raw!r}: give thread counts >= 1, comma-separated (e.g. 1,2)")
    return [check_threads("--threads", v, minimum=1) for v in values]


def parse_spin(raw: str, option: str = "--spin") -> list[bool]:
    """A 0/1 axis (``--spin``, ``--pipeline``): "0", "1" or both, comma-separated."""
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not values or any(v not in ("0", "1") for v in values):
        raise KzttsError(f"{option} {raw!r}: give 1, 0, or 0,1 for both")
    return [v == "1" for v in values]



@dataclass(frozen=True)
class HtpConfig:
    """One HTP row: a qnn_configs target (name or JSON path) at one weight precision, run on the
    HTP simulator for accuracy only (never timed). ``context`` is the static Talker context."""

    target: str
    precision: str = "fp16"
    context: int = 0  # 0: chosen by the bench (the prompt + frames, at least 64)

    @property
    def name(self) -> str:
        return f"htp-sim/{Path(self.target).stem}/{self.precision}"

    @property
    def slug(self) -> str:
        return self.name.replace("/", "_")

    def as_dict(self) -> dict:
        return {"target": self.target, "htp_precision": self.precision, "context": self.context,
                "name": self.name, "weights": self.precision}


def parse_targets(raw: str) -> tuple[bool, list[str]]:
    """``--target``: (whether the CPU grid runs, the HTP targets); every target is loaded and
    checked here, so a bad name fails before any work."""
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not values:
        raise KzttsError(f"--target {raw!r}: give cpu and/or qnn_configs targets (e.g. cpu,simulator)")
    htp = [v for v in values if v != "cpu"]
    for v in htp:
        load_target(v)
    return "cpu" in values, list(dict.fromkeys(htp))


def parse_htp_precisions(raw: str) -> list[str]:
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not values or any(v not in G.HTP_PRECISIONS for v in values):
        raise KzttsError(f"--htp-precision {raw!r}: choose from {', '.join(G.HTP_PRECISIONS)} (comma-separated)")
    return list(dict.fromkeys(values))


def htp_grid(targets: list[str], precisions: list[str], context: int = 0) -> list[HtpConfig]:
    """Every (target, precision) pair, targets outermost."""
    return [HtpConfig(t, p, context) for t, p in itertools.product(targets, precisions)]


def grid(weights, kv, cp_mode, decoder, threads, spin=(False,), attention=("fused",), pipeline=(False,)) -> list[Config]:
    """Every combination, in a stable order (threads outermost, so runs sharing a thread count
    sit together; the attention and pipeline variants of one configuration side by side)."""
    return [Config(w, k, m, d, t, s, a, p) for t, w, k, m, d, s, a, p
            in itertools.product(threads, weights, kv, cp_mode, decoder, spin, attention, pipeline)]
