"""The configurations ``kztts bench`` runs: the cross product of the requested axes."""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from kztts.errors import KzttsError

AXES = {
    "weights": ("fp32", "int8", "int4"),
    "kv": ("fp32", "fp16"),
    "cp_mode": ("frame", "step"),
    "decoder": ("fp32", "int8"),
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

    @property
    def name(self) -> str:
        return (f"{self.weights}/kv-{self.kv}/cp-{self.cp_mode}/dec-{self.decoder}/t{self.threads}"
                + ("/spin" if self.spin else ""))

    @property
    def slug(self) -> str:
        return self.name.replace("/", "_")

    def as_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


def parse_list(raw: str, axis: str) -> list[str]:
    values = [v.strip() for v in raw.split(",") if v.strip()]
    allowed = AXES[axis]
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
    return values


def parse_spin(raw: str) -> list[bool]:
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not values or any(v not in ("0", "1") for v in values):
        raise KzttsError(f"--spin {raw!r}: give 1 (spinning threads), 0, or 1,0")
    return [v == "1" for v in values]


def grid(weights, kv, cp_mode, decoder, threads, spin=(False,)) -> list[Config]:
    """Every combination, in a stable order (threads outermost, so runs sharing a thread count
    sit together)."""
    return [Config(w, k, m, d, t, s) for t, w, k, m, d, s
            in itertools.product(threads, weights, kv, cp_mode, decoder, spin)]
