"""Which Talker layers run where: placement modes, placement files, and their checks.

A placement gives, for each phase (``prefill``, ``decode``), a device (``cpu`` or
``htp``) for every Talker layer and for the head (final norm + codec head).
Adjacent units of a phase on one device form a segment (``kztts.bundle.segments``).

Modes
  ``all-htp``                 everything on the HTP (fp16 / quantized)
  ``all-cpu``                 everything on the CPU (fp32)
  ``prefill-htp-decode-cpu``  the prompt on the HTP, its KV handed to CPU decode graphs
  ``guarded``                 from ``kztts calibrate``: layers whose fp32 magnitudes pass the
                              safety threshold on the CPU, the rest on the HTP
  ``explicit``                per-layer lists written by hand, in a placement file or in a
                              qnn_configs target file (key ``layer_placement``)

Placement file (``kztts-placement/1``; ``kztts calibrate`` writes one)::

    {"schema": "kztts-placement/1", "mode": "guarded", "num_layers": 4,
     "prefill": {"layers": ["htp", "cpu", "htp", "htp"], "head": "htp"},
     "decode":  {"cpu_layers": [1]}}

A phase is ``{"layers": [device per layer]}`` or ``{"cpu_layers": [indices]}`` (the
others on the HTP), with an optional ``"head"`` (default ``htp``); ``"talker"`` sets
both phases at once. Unknown keys, layers or devices are refused, naming the file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kztts.bundle.graphs import DEVICES
from kztts.bundle.segments import Segment
from kztts.core.atomic import write_text
from kztts.core.errors import KzttsError

SCHEMA = "kztts-placement/1"
PHASES = ("prefill", "decode")
MODES = ("all-htp", "all-cpu", "prefill-htp-decode-cpu", "guarded", "explicit")
BUILTIN_MODES = ("all-htp", "all-cpu", "prefill-htp-decode-cpu")
_OPTIONAL_KEYS = ("schema", "num_layers", "description", "threshold", "calibration")


class PlacementError(KzttsError):
    """A placement file or mode that cannot apply to this model."""


@dataclass(frozen=True)
class PhasePlacement:
    layers: tuple[str, ...]
    head: str

    def segments(self, phase: str) -> list[Segment]:
        """Runs of adjacent units on one device, in execution order (the head joins the last run
        when it shares its device)."""
        out: list[Segment] = []
        start = 0
        for i in range(1, len(self.layers) + 1):
            if i == len(self.layers) or self.layers[i] != self.layers[start]:
                out.append(Segment(phase, self.layers[start], start, i, False))
                start = i
        n = len(self.layers)
        if out and out[-1].device == self.head:
            last = out.pop()
            out.append(Segment(phase, last.device, last.start, last.stop, True))
        else:
            out.append(Segment(phase, self.head, n, n, True))
        return out

    @property
    def devices(self) -> set[str]:
        return {*self.layers, self.head}

    def to_json(self) -> dict:
        return {"layers": list(self.layers), "head": self.head}


@dataclass(frozen=True)
class LayerPlacement:
    """Devices of the Talker's layers and head, per phase."""

    mode: str
    prefill: PhasePlacement
    decode: PhasePlacement
    source: str = ""
    info: dict = field(default_factory=dict, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.prefill.layers)

    def phase(self, name: str) -> PhasePlacement:
        return self.prefill if name == "prefill" else self.decode

    def segments(self, phase: str) -> list[Segment]:
        return self.phase(phase).segments(phase)

    @property
    def devices(self) -> set[str]:
        """The devices of either phase."""
        return self.prefill.devices | self.decode.devices

    def uniform(self, phase: str | None = None) -> str | None:
        """The one device everything (of ``phase``) runs on, or None when it is split."""
        devs = self.phase(phase).devices if phase else self.devices
        return next(iter(devs)) if len(devs) == 1 else None

    def cpu_layers(self, phase: str) -> list[int]:
        return [i for i, d in enumerate(self.phase(phase).layers) if d == "cpu"]

    def describe(self) -> str:
        parts = []
        for ph in PHASES:
            parts.append(f"{ph}: " + ", ".join(f"{s.label} on {s.device}" for s in self.segments(ph)))
        return f"{self.mode} ({'; '.join(parts)})"

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "mode": self.mode, "num_layers": self.num_layers,
                "prefill": self.prefill.to_json(), "decode": self.decode.to_json(), **self.info}


def builtin(mode: str, num_layers: int) -> LayerPlacement:
    """``all-htp``, ``all-cpu`` or ``prefill-htp-decode-cpu`` for a Talker of ``num_layers`` layers."""
    def every(dev: str) -> PhasePlacement:
        return PhasePlacement((dev,) * num_layers, dev)

    if mode == "all-htp":
        return LayerPlacement(mode, every("htp"), every("htp"), mode)
    if mode == "all-cpu":
        return LayerPlacement(mode, every("cpu"), every("cpu"), mode)
    if mode == "prefill-htp-decode-cpu":
        return LayerPlacement(mode, every("htp"), every("cpu"), mode)
    if mode in ("guarded", "explicit"):
        raise PlacementError(f"placement mode {mode!r} needs a file: `kztts calibrate BUNDLE -o placement.json` "
                             "writes a guarded one; an explicit one lists the layers (see kztts.htp.placement)")
    raise PlacementError(f"unknown placement {mode!r}: give one of {', '.join(BUILTIN_MODES)} or a placement file")


def _err(where: str, key: str, msg: str) -> PlacementError:
    return PlacementError(f"{where}: {key}: {msg}")


def _device(where: str, key: str, v: Any) -> str:
    if v not in DEVICES:
        raise _err(where, key, f"unknown device {json.dumps(v)} (allowed: {', '.join(DEVICES)})")
    return v


def parse_phase(data: Any, where: str, key: str, num_layers: int | None) -> PhasePlacement:
    """One phase spec (module docstring) for a Talker of ``num_layers`` layers (None: any count,
    for files read before the model is known)."""
    if not isinstance(data, dict):
        raise _err(where, key, f"expected an object, got {json.dumps(data)}")
    for k in data:
        if k not in ("layers", "cpu_layers", "head"):
            raise _err(where, f"{key}.{k}", "unknown key (allowed: layers, cpu_layers, head)")
    if ("layers" in data) == ("cpu_layers" in data):
        raise _err(where, key, "give exactly one of 'layers' (a device per layer) or 'cpu_layers' (indices)")
    head = _device(where, f"{key}.head", data.get("head", "htp"))
    if "layers" in data:
        layers = data["layers"]
        if num_layers is None and isinstance(layers, list):
            num_layers = len(layers)
        if not isinstance(layers, list) or len(layers) != num_layers:
            raise _err(where, f"{key}.layers", f"needs one device per layer: the Talker has {num_layers} layers, "
                                               f"the list has {len(layers) if isinstance(layers, list) else '?'}")
        return PhasePlacement(tuple(_device(where, f"{key}.layers[{i}]", d) for i, d in enumerate(layers)), head)
    idx = data["cpu_layers"]
    if not isinstance(idx, list):
        raise _err(where, f"{key}.cpu_layers", f"expected a list of layer indices, got {json.dumps(idx)}")
    if num_layers is None:
        num_layers = max([i + 1 for i in idx if isinstance(i, int) and not isinstance(i, bool)] + [0])
    devs = ["htp"] * num_layers
    for i in idx:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < num_layers:
            raise _err(where, f"{key}.cpu_layers", f"unknown layer {json.dumps(i)}: the Talker has layers "
                                                   f"0..{num_layers - 1}")
        devs[i] = "cpu"
    return PhasePlacement(tuple(devs), head)


def parse_phases(data: dict, where: str, num_layers: int | None, prefix: str = "") -> tuple[PhasePlacement, PhasePlacement]:
    """(prefill, decode) from ``data``'s ``prefill``/``decode`` keys or its ``talker`` key."""
    if not isinstance(data, dict):
        raise _err(where, prefix.rstrip(".") or "(top level)", f"expected an object, got {json.dumps(data)}")
    for k in data:
        if k not in ("talker", *PHASES):
            raise _err(where, prefix + k, "unknown key (allowed: talker, prefill, decode)")
    if "talker" in data:
        if "prefill" in data or "decode" in data:
            raise _err(where, prefix + "talker", "give either 'talker' (both phases) or 'prefill' and 'decode'")
        both = parse_phase(data["talker"], where, prefix + "talker", num_layers)
        return both, both
    missing = [p for p in PHASES if p not in data]
    if missing:
        raise _err(where, prefix + missing[0], "missing (give 'prefill' and 'decode', or 'talker' for both)")
    return tuple(parse_phase(data[p], where, prefix + p, num_layers) for p in PHASES)  # type: ignore[return-value]


def parse_placement(data: Any, where: str, num_layers: int) -> LayerPlacement:
    """A ``kztts-placement/1`` document for a Talker of ``num_layers`` layers."""
    if not isinstance(data, dict):
        raise _err(where, "(top level)", "expected a JSON object")
    for k in data:
        if k not in ("mode", "prefill", "decode", "talker", *_OPTIONAL_KEYS):
            raise _err(where, k, "unknown key (allowed: mode, prefill, decode, talker, " + ", ".join(_OPTIONAL_KEYS) + ")")
    if data.get("schema", SCHEMA) != SCHEMA:
        raise _err(where, "schema", f"{data['schema']!r} is not supported (expected {SCHEMA!r})")
    mode = data.get("mode", "explicit")
    if mode not in MODES:
        raise _err(where, "mode", f"unknown mode {json.dumps(mode)} (allowed: {', '.join(MODES)})")
    if "num_layers" in data and data["num_layers"] != num_layers:
        raise _err(where, "num_layers", f"the file is for a {data['num_layers']}-layer Talker, this model has "
                                        f"{num_layers}: calibrate this bundle again")
    prefill, decode = parse_phases({k: data[k] for k in ("talker", *PHASES) if k in data}, where, num_layers)
    info = {k: data[k] for k in ("threshold", "calibration", "description") if k in data}
    return LayerPlacement(mode, prefill, decode, where, info)


def write_placement(placement: LayerPlacement, path: str | Path) -> Path:
    path = Path(path)
    try:
        return write_text(path, json.dumps(placement.to_json(), indent=2) + "\n")
    except OSError as exc:
        raise KzttsError(f"cannot write the placement file {path}: {exc.strerror or exc}") from exc
