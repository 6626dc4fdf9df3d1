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

A precision plan (``kztts calibrate`` writes one) names an HTP precision instead of ``htp`` where a
unit runs quantized: ``"layers": ["w4a16", "cpu", "w8a16", "w4a16"], "head": "w8a16"`` (``cpu``: fp32 on
the CPU; ``htp``: the float layer graph, fp16; an HTP precision of ``kztts.bundle.graphs``: that unit's
QDQ layer graph, exported with ``--segments --placement``). Optional ``"graphs": {"cp_frame": precision}``
sets the Code Predictor's, and ``"matmuls": {"3.down_proj": precision}`` one MatMul's (keys of
``kztts.htp.weights.matmul_keys``; the weights are shared by both phases). Whole-stack graphs exported with
a plan (``kztts export --target T --placement P`` without ``--segments``) carry its precisions per MatMul
(``whole_stack_precisions``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kztts.bundle import graphs as G
from kztts.bundle.graphs import DEVICES
from kztts.bundle.segments import Segment, Unit, segment_graph_name
from kztts.core.atomic import write_text
from kztts.core.errors import KzttsError
from kztts.htp.weights import HEAD, PROJECTIONS

SCHEMA = "kztts-placement/1"
PHASES = ("prefill", "decode")
MODES = ("all-htp", "all-cpu", "prefill-htp-decode-cpu", "guarded", "explicit")
BUILTIN_MODES = ("all-htp", "all-cpu", "prefill-htp-decode-cpu")
_OPTIONAL_KEYS = ("schema", "num_layers", "description", "threshold", "calibration", "graphs", "matmuls",
                  "sqnr_threshold_db", "matmul_sqnr_threshold_db")
_INFO_KEYS = ("threshold", "calibration", "description", "sqnr_threshold_db", "matmul_sqnr_threshold_db")
PLAN_GRAPHS = ("cp_frame",)  # graphs besides the Talker's a plan gives a precision
_MATMUL_KEY = re.compile(r"^(?:(\d+)\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)|head)$")


class PlacementError(KzttsError):
    """A placement file or mode that cannot apply to this model."""


@dataclass(frozen=True)
class PhasePlacement:
    """Devices of one phase's layers and head; ``precisions`` / ``head_precision``: an HTP precision where a
    unit on the HTP runs a QDQ layer graph (None: the device's float graph)."""

    layers: tuple[str, ...]
    head: str
    precisions: tuple[str | None, ...] = ()
    head_precision: str | None = None

    def precision(self, unit: Unit) -> str | None:
        """The HTP precision of ``unit`` (a layer index or "head") when it has one."""
        if unit == "head":
            return self.head_precision
        return self.precisions[unit] if self.precisions else None

    def label(self, unit: Unit) -> str:
        """``cpu``, ``htp`` or the unit's HTP precision, as the file writes it."""
        device = self.head if unit == "head" else self.layers[unit]
        return self.precision(unit) or device

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
        return {"layers": [self.label(i) for i in range(len(self.layers))], "head": self.label("head")}


@dataclass(frozen=True)
class LayerPlacement:
    """Devices of the Talker's layers and head, per phase."""

    mode: str
    prefill: PhasePlacement
    decode: PhasePlacement
    source: str = ""
    info: dict = field(default_factory=dict, compare=False)
    graphs: dict = field(default_factory=dict)  # {"cp_frame": HTP precision}
    matmuls: dict = field(default_factory=dict)  # {MatMul key: HTP precision}

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

    def units(self, phase: str) -> list[Unit]:
        return [*range(self.num_layers), "head"]

    def htp_precisions(self) -> set[str]:
        """The HTP precisions the plan runs: each unit's on the HTP (a float unit: fp16), ``graphs``', ``matmuls'``."""
        out = {self.phase(ph).precision(u) or G.FLOAT_HTP_PRECISION for ph in PHASES for u in self.units(ph)
               if (self.phase(ph).head if u == "head" else self.phase(ph).layers[u]) == "htp"}
        return out | set(self.graphs.values()) | set(self.matmuls.values())

    @property
    def quantized(self) -> bool:
        """Whether any unit, graph or MatMul of the plan runs at a quantized precision."""
        return any(G.htp_precision(p).quantized for p in self.htp_precisions())

    def quantized_units(self) -> list[tuple[str, Unit, str]]:
        """(phase, unit, precision) of the units on the HTP at a quantized precision (their QDQ layer graphs)."""
        return [(ph, u, self.phase(ph).precision(u)) for ph in PHASES for u in self.units(ph)
                if self.phase(ph).precision(u) and G.htp_precision(self.phase(ph).precision(u)).quantized]

    def bounds_precision(self) -> str:
        """The precision whose ``validate`` bounds judge this plan: its least precise (a mixed plan is bounded as
        its lossiest member)."""
        return G.least_precise(self.htp_precisions() or {G.FLOAT_HTP_PRECISION})

    def unit_graph(self, phase: str, unit: Unit) -> str:
        """The layer graph ``unit`` runs: its QDQ variant at a quantized precision, else the float one."""
        p = self.phase(phase).precision(unit)
        return segment_graph_name(phase, unit, p if p and G.htp_precision(p).quantized else None)

    def unit_matmuls(self, phase: str, unit: Unit) -> dict[str, str]:
        """{MatMul key: precision} of ``unit``'s MatMuls that ``matmuls`` sets apart from the unit's precision."""
        own = self.phase(phase).precision(unit)
        prefix = "head" if unit == "head" else f"{unit}."
        return {k: p for k, p in self.matmuls.items() if (k == prefix if unit == "head" else k.startswith(prefix))
                and p != own}

    def whole_stack_precisions(self) -> dict[str, str]:
        """{MatMul key: quantized precision} of whole-stack QDQ graphs exported with this plan: per layer (and
        head) the more precise of its two phases' precisions (the prefill and decode graphs hold the same
        weights), a unit on the CPU or in fp16 at the most precise quantized one (a whole-stack graph has no
        CPU layer; its activations are 16-bit with their own ranges, not fp16), then ``matmuls``."""
        def quantized(unit: Unit) -> str:
            ps = [self.phase(ph).precision(unit) for ph in PHASES]
            ps = [p if p and G.htp_precision(p).quantized else G.most_precise_quantized() for p in ps]
            return min(ps, key=G.HTP_PRECISIONS.index)

        out = {f"{i}.{p}": quantized(i) for i in range(self.num_layers) for p in PROJECTIONS}
        out[HEAD] = quantized("head")
        out.update(self.matmuls)
        return out

    def describe(self) -> str:
        parts = []
        for ph in PHASES:
            pp = self.phase(ph)
            segs = []
            for s in self.segments(ph):
                precs = sorted({pp.precision(u) or (G.FLOAT_HTP_PRECISION if s.device == "htp" else G.CPU_PRECISION)
                                for u in s.units}, key=lambda p: (p not in G.HTP_PRECISIONS, p))
                quant = any(p in G.QUANTIZED_PRECISIONS for p in precs)
                segs.append(f"{s.label} on {s.device}" + (f" ({'/'.join(precs)})" if quant else ""))
            parts.append(f"{ph}: " + ", ".join(segs))
        extra = "".join(f"; {g} {p}" for g, p in self.graphs.items())
        extra += f"; {len(self.matmuls)} MatMul precisions" if self.matmuls else ""
        return f"{self.mode} ({'; '.join(parts)}{extra})"

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "mode": self.mode, "num_layers": self.num_layers,
                "prefill": self.prefill.to_json(), "decode": self.decode.to_json(),
                **({"graphs": dict(self.graphs)} if self.graphs else {}),
                **({"matmuls": dict(self.matmuls)} if self.matmuls else {}), **self.info}


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


def _unit(where: str, key: str, v: Any) -> tuple[str, str | None]:
    """(device, HTP precision or None) of one unit entry: a device, or an HTP precision (on the HTP)."""
    if v in G.HTP_PRECISIONS:
        return "htp", v
    if v not in DEVICES:
        raise _err(where, key, f"unknown device or precision {json.dumps(v)} (allowed: "
                               f"{', '.join((*DEVICES, *G.HTP_PRECISIONS))})")
    return v, None


def _precision(where: str, key: str, v: Any, allowed=None) -> str:
    allowed = allowed or G.HTP_PRECISIONS
    if v not in allowed:
        raise _err(where, key, f"unknown precision {json.dumps(v)} (allowed: {', '.join(allowed)})")
    return v


def parse_graphs(data: Any, where: str) -> dict[str, str]:
    """A plan's ``graphs`` object: {graph: HTP precision} for ``PLAN_GRAPHS``."""
    if not isinstance(data, dict):
        raise _err(where, "graphs", f"expected an object, got {json.dumps(data)}")
    for g, p in data.items():
        if g not in PLAN_GRAPHS:
            raise _err(where, f"graphs.{g}", f"unknown graph (allowed: {', '.join(PLAN_GRAPHS)})")
        _precision(where, f"graphs.{g}", p)
    return dict(data)


def parse_matmuls(data: Any, where: str, num_layers: int | None) -> dict[str, str]:
    """A plan's ``matmuls`` object: {"{layer}.{projection}" or "head": quantized HTP precision}."""
    if not isinstance(data, dict):
        raise _err(where, "matmuls", f"expected an object, got {json.dumps(data)}")
    for k, p in data.items():
        m = _MATMUL_KEY.match(str(k))
        if m is None or (m.group(1) is not None and num_layers is not None and int(m.group(1)) >= num_layers):
            raise _err(where, f"matmuls.{k}", "unknown MatMul (keys: LAYER.q_proj .. LAYER.down_proj for layers "
                                              f"0..{(num_layers or 1) - 1}, or head)")
        _precision(where, f"matmuls.{k}", p, G.QUANTIZED_PRECISIONS)
    return dict(data)


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
    head, head_precision = _unit(where, f"{key}.head", data.get("head", "htp"))
    if "layers" in data:
        layers = data["layers"]
        if num_layers is None and isinstance(layers, list):
            num_layers = len(layers)
        if not isinstance(layers, list) or len(layers) != num_layers:
            raise _err(where, f"{key}.layers", f"needs one device per layer: the Talker has {num_layers} layers, "
                                               f"the list has {len(layers) if isinstance(layers, list) else '?'}")
        units = [_unit(where, f"{key}.layers[{i}]", d) for i, d in enumerate(layers)]
        precisions = tuple(p for _, p in units)
        return PhasePlacement(tuple(d for d, _ in units), head, precisions if any(precisions) else (), head_precision)
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
    return PhasePlacement(tuple(devs), head, (), head_precision)


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
    info = {k: data[k] for k in _INFO_KEYS if k in data}
    return LayerPlacement(mode, prefill, decode, where, info, parse_graphs(data.get("graphs", {}), where),
                          parse_matmuls(data.get("matmuls", {}), where, num_layers))


def write_placement(placement: LayerPlacement, path: str | Path) -> Path:
    path = Path(path)
    try:
        return write_text(path, json.dumps(placement.to_json(), indent=2) + "\n")
    except OSError as exc:
        raise KzttsError(f"cannot write the placement file {path}: {exc.strerror or exc}") from exc
