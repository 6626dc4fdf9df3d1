"""Deployment targets (``qnn_configs/<name>.json``): SoC, precision, QNN provider options,
static shapes and default placement, validated when loaded.

The QNN execution provider accepts any string for most of its options and silently
ignores bad ones (a bogus ``htp_performance_mode`` runs without complaint), so every
key and value of a target file is checked here: an unknown key, a value of the wrong
type or outside its range, a SoC number that does not match the SoC name, or a
missing field raises :class:`TargetError` naming the file and the key.

File layout (all keys required unless marked optional)::

    {
      "schema": "kztts-qnn-target/1",
      "name": "sm8650",
      "description": "...",
      "runs_on": "device" | "simulator",
      "soc": {"name": "SM8650", "marketing_name": "...", "soc_model": 57, "htp_arch": 75},
      "precision": "fp16" | "w8a16" | "w4a16" (kztts.bundle.graphs.HTP_PRECISIONS),
      "provider_options": {"htp_performance_mode": "burst", ...},   # see PROVIDER_OPTIONS
      "shapes": {"prefill_chunk": 128, "context": 4096, "decoder_chunk": 25},
      "attention_mask_value": -50.0,
      "placement": {"talker_prefill": "htp", "talker_decode": "htp", "cp_frame": "htp", "decoder": "cpu",
                    "speaker_encoder": "cpu"},                                    # speaker_encoder optional
      "kv_dtype": "fp16",                    # optional: Talker KV I/O, kztts.bundle.graphs.HTP_KV_DTYPES
      "process_context_mb": 2600,            # optional: HTP graphs per process (kztts.htp.hosts)
      "cost": {"dram_gbps": 76.8, "dram_source": "...", ...}                       # optional, see COST_FIGURES
    }

``soc_model``, ``htp_arch``, ``backend_path`` and ``backend_type`` are not provider
options of the file: kztts derives them from ``soc`` and the installed onnxruntime-qnn.
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from kztts.bundle import graphs as G
from kztts.core import env
from kztts.core.errors import KzttsError
from kztts.htp.placement import LayerPlacement, PlacementError, parse_phases

SCHEMA = "kztts-qnn-target/1"
RUNS_ON = ("device", "simulator")
# optional "talker_graphs": the static Talker as prompt + token graphs, or the prompt graph alone
# (decode steps run as padded prefill chunks: one weight copy where weight sharing is unavailable)
TALKER_GRAPHS = ("prefill+decode", "prefill-only")


class TargetError(KzttsError):
    """A target file is missing, unreadable or does not follow the schema."""


@dataclass(frozen=True)
class SocInfo:
    name: str
    soc_model: int  # QNN's SoC id (QNN SDK "Supported Snapdragon devices" table)
    htp_arch: int  # Hexagon architecture version (v73 -> 73)
    vtcm_mb: int  # VTCM size: the largest vtcm_mb the SoC accepts
    aliases: tuple[str, ...] = ()


# QNN SoC ids and HTP versions, as in Qualcomm's own tables (QNN SDK docs; the same numbers
# appear in LiteRT's and ExecuTorch's Qualcomm backends).
SOCS = {s.name: s for s in (
    SocInfo("SM8450", 36, 69, 8),  # Snapdragon 8 Gen 1
    SocInfo("SM8550", 43, 73, 8),  # Snapdragon 8 Gen 2
    SocInfo("SM8650", 57, 75, 8),  # Snapdragon 8 Gen 3
    SocInfo("SM8750", 69, 79, 8),  # Snapdragon 8 Elite
    SocInfo("SC8380XP", 60, 73, 8, ("X1E80100",)),  # Snapdragon X Elite
    # Snapdragon X2 Elite: soc_model 88 from onnxruntime-qnn's soc_utils.cc ({"SC8480XP", 88}), v81 from
    # Qualcomm AI Hub's device list (sc8480xp, hexagon v81); the 8 MB VTCM is assumed (not published)
    SocInfo("SC8480XP", 88, 81, 8, ("X2E94100",)),
)}
_SOC_ALIASES = {a: s for s in SOCS.values() for a in (s.name, *s.aliases)}

_BOOL = ("0", "1")
_PERF_MODES = ("burst", "balanced", "default", "high_performance", "high_power_saver", "low_balanced",
               "extreme_power_saver", "low_power_saver", "power_saver", "sustained_high_performance")


def _enum(*values: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        s = _as_str(v)
        if s not in values:
            raise ValueError(f"{v!r} is not one of {', '.join(values)}")
        return s
    return check


def _int_range(lo: int, hi: int) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise ValueError(f"{v!r} is not an integer")
        try:
            n = int(v)
        except ValueError:
            raise ValueError(f"{v!r} is not an integer") from None
        if not lo <= n <= hi:
            raise ValueError(f"{n} is outside {lo}..{hi}")
        return str(n)
    return check


def _as_str(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (int, str)):
        return str(v)
    raise ValueError(f"{v!r} is not a string")


# Provider options a target may set, with their checks; values are normalised to the
# strings the EP expects. Values the project owns (backend, soc_model, htp_arch) are refused.
PROVIDER_OPTIONS: dict[str, Callable[[Any], str]] = {
    "htp_performance_mode": _enum(*_PERF_MODES),
    "htp_graph_finalization_optimization_mode": _enum("0", "1", "2", "3"),
    "vtcm_mb": _int_range(1, 64),  # checked against the SoC below
    "enable_htp_fp16_precision": _enum(*_BOOL),
    "offload_graph_io_quantization": _enum(*_BOOL),
    "qnn_context_priority": _enum("low", "normal", "normal_high", "high"),
    "rpc_control_latency": _int_range(0, 100000),
    "profiling_level": _enum("off", "basic", "detailed"),
    "enable_htp_spill_fill_buffer": _enum(*_BOOL),
    "enable_htp_shared_memory_allocator": _enum(*_BOOL),
    "htp_bf16_enable": _enum(*_BOOL),
    "device_id": _int_range(0, 16),
}
_OWNED_OPTIONS = {
    "backend_path": "kztts uses the HTP backend of the installed onnxruntime-qnn",
    "backend_type": "kztts uses the HTP backend of the installed onnxruntime-qnn",
    "soc_model": "set soc.soc_model instead",
    "htp_arch": "set soc.htp_arch instead",
}


# Published figures for ``kztts.htp.cost``'s paper estimate (optional ``cost`` object of a device target):
# each number with the key that must cite its public source. A source without its number says why none is given.
COST_FIGURES = {"dram_gbps": "dram_source", "effective_gbps": "effective_source", "htp_int8_tops": "tops_source"}


@dataclass(frozen=True)
class Shapes:
    """Static shapes of the HTP graphs."""

    prefill_chunk: int  # positions per Talker prefill run
    context: int  # Talker KV positions (prompt + frames)
    decoder_chunk: int  # codec frames per speech-decoder run


@dataclass(frozen=True)
class Target:
    name: str
    path: Path
    description: str
    runs_on: str
    soc: SocInfo
    marketing_name: str
    precision: str
    provider_options: dict[str, str]
    shapes: Shapes
    attention_mask_value: float
    placement: dict[str, str]
    layer_placement: dict | None = None  # per-layer Talker devices (kztts.htp.placement), checked per model
    kv_dtype: str | None = None  # static Talker KV I/O (kztts.bundle.graphs.HTP_KV_DTYPES); None: the precision's default
    talker_graphs: str = TALKER_GRAPHS[0]  # see TALKER_GRAPHS
    cost: dict | None = None  # published bandwidth/throughput figures with their sources (COST_FIGURES)
    # the most MB of HTP graph files one process opens; more go to host processes (kztts.htp.hosts)
    process_context_mb: float | None = None
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    def qnn_options(self, backend_path: str) -> dict[str, str]:
        """Provider options for ``add_provider_for_devices``: the file's, plus backend and SoC.

        With ``soc_model`` set the HTP computes in fp16 (QAIRT >= 2.35 has no fp32 HTP math);
        quantized (QDQ) graphs run in their integer types."""
        opts = {"backend_path": backend_path, "soc_model": str(self.soc.soc_model),
                "htp_arch": str(self.soc.htp_arch)}
        opts.update(self.provider_options)
        return opts

    def layer_placement_for(self, num_layers: int) -> LayerPlacement:
        """The target's ``layer_placement`` for a Talker of ``num_layers`` layers."""
        if self.layer_placement is None:
            raise PlacementError(f"{self.path}: the target has no 'layer_placement' (per-layer devices); add one, "
                                 "or give a placement mode or file")
        prefill, decode = parse_phases(self.layer_placement, str(self.path), num_layers, "layer_placement.")
        return LayerPlacement("explicit", prefill, decode, str(self.path))

    def on_htp(self, graph: str) -> bool:
        return self.placement.get(graph, "cpu") == "htp"

    def with_shapes(self, **changes: int) -> "Target":
        """The same target with other static shapes (tests use small contexts)."""
        shapes = replace(self.shapes, **changes)
        _check_shapes(self.path, shapes)
        return replace(self, shapes=shapes)

    def to_json(self) -> dict:
        """What a bundle records about the target it was exported for."""
        return {"name": self.name, "soc": self.soc.name, "soc_model": self.soc.soc_model,
                "htp_arch": self.soc.htp_arch,
                "runs_on": self.runs_on, "precision": self.precision,
                "shapes": {"prefill_chunk": self.shapes.prefill_chunk, "context": self.shapes.context,
                           "decoder_chunk": self.shapes.decoder_chunk},
                "attention_mask_value": self.attention_mask_value, "placement": dict(self.placement),
                "provider_options": dict(self.provider_options), "talker_graphs": self.talker_graphs}


def configs_dir() -> Path:
    """``$KZTTS_QNN_CONFIGS`` if set, else the shipped targets: the data package ``kztts.qnn_configs``
    (``kztts/qnn_configs/`` in a wheel), else the source tree's ``qnn_configs/`` (an editable install,
    whose import finder does not resolve a package without ``__init__.py`` below a mapped one)."""
    configured = env.path("KZTTS_QNN_CONFIGS")
    if configured is not None:
        return configured
    spec = importlib.util.find_spec("kztts.qnn_configs")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "qnn_configs"


def list_targets() -> list[str]:
    d = configs_dir()
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def target_path(name_or_path: str | os.PathLike) -> Path:
    """A target name (``sm8650``) or a JSON file path -> the file."""
    s = str(name_or_path)
    p = Path(s).expanduser()
    if s.endswith(".json") or os.sep in s or p.is_file():
        if not p.is_file():
            raise TargetError(f"{p}: target file not found")
        return p
    f = configs_dir() / f"{s}.json"
    if not f.is_file() and (configs_dir() / f"{s.replace('-', '_')}.json").is_file():
        f = configs_dir() / f"{s.replace('-', '_')}.json"  # x-elite names x_elite.json
    if not f.is_file():
        known = ", ".join(list_targets()) or "none"
        raise TargetError(f"unknown target {s!r}: no {f} (known targets: {known}; or give a path to a JSON file)")
    return f


def load_target(name_or_path: "str | os.PathLike | Target") -> Target:
    """Read and validate a target; raises :class:`TargetError` naming the file and key."""
    if isinstance(name_or_path, Target):
        return name_or_path
    path = target_path(name_or_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TargetError(f"{path}: not a readable JSON file ({exc})") from exc
    return parse_target(data, path)


# ------------------------------------------------------------------ validation
def _err(path: Path, key: str, msg: str) -> TargetError:
    return TargetError(f"{path}: {key}: {msg}")


def _obj(path: Path, data: Any, where: str, required: dict[str, type], optional: dict[str, type] = {}) -> dict:
    """Check an object's keys (no unknown, none missing) and value types."""
    if not isinstance(data, dict):
        raise _err(path, where or "(top level)", f"expected a JSON object, got {type(data).__name__}")
    prefix = f"{where}." if where else ""
    allowed = {**required, **optional}
    for k in data:
        if k not in allowed:
            raise _err(path, prefix + k, f"unknown key (allowed: {', '.join(allowed)})")
    for k in required:
        if k not in data:
            raise _err(path, prefix + k, "missing required field")
    for k, typ in allowed.items():
        if k in data:
            v = data[k]
            ok = isinstance(v, typ) and not (typ in (int, float, (int, float)) and isinstance(v, bool))
            if not ok:
                want = typ.__name__ if isinstance(typ, type) else "number"
                raise _err(path, prefix + k, f"expected {want}, got {json.dumps(v)}")
    return data


def _check_shapes(path: Path, s: Shapes) -> None:
    for k in ("prefill_chunk", "context", "decoder_chunk"):
        v = getattr(s, k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise _err(path, f"shapes.{k}", f"must be a positive integer, got {v!r}")
    if G.DECODER_LEFT_CONTEXT % s.decoder_chunk:
        raise _err(path, "shapes.decoder_chunk",
                   f"{s.decoder_chunk} must divide {G.DECODER_LEFT_CONTEXT}: the speech decoder runs segments of "
                   f"{G.DECODER_SEGMENT} frames after {G.DECODER_LEFT_CONTEXT} frames of left context, and a static "
                   "chunk may not straddle a boundary (use 1, 5 or 25)")
    if s.context > 32768:
        raise _err(path, "shapes.context", f"{s.context} exceeds 32768 positions")
    if s.prefill_chunk >= s.context:
        raise _err(path, "shapes.prefill_chunk",
                   f"{s.prefill_chunk} must be smaller than shapes.context ({s.context})")


def _check_soc(path: Path, soc: dict) -> SocInfo:
    """The SoC a target names, its QNN number and HTP version checked against the known ones."""
    info = _SOC_ALIASES.get(soc["name"].upper())
    if info is None:
        raise _err(path, "soc.name", f"unknown SoC {soc['name']!r} (known: {', '.join(SOCS)})")
    if soc["soc_model"] != info.soc_model:
        raise _err(path, "soc.soc_model", f"{soc['soc_model']} is not the QNN SoC number of {info.name} "
                                          f"(expected {info.soc_model})")
    if soc["htp_arch"] != info.htp_arch:
        raise _err(path, "soc.htp_arch", f"{soc['htp_arch']} is not the HTP version of {info.name} "
                                         f"(expected {info.htp_arch})")
    return info


def _check_provider_options(path: Path, given: dict, info: SocInfo) -> dict[str, str]:
    """QNN provider options, each known and in range for the SoC (the EP itself accepts any string)."""
    options: dict[str, str] = {}
    for k, v in given.items():
        key = f"provider_options.{k}"
        if k in _OWNED_OPTIONS:
            raise _err(path, key, f"not allowed in a target file ({_OWNED_OPTIONS[k]})")
        check = PROVIDER_OPTIONS.get(k)
        if check is None:
            raise _err(path, key, f"unknown provider option (allowed: {', '.join(PROVIDER_OPTIONS)})")
        try:
            options[k] = check(v)
        except ValueError as exc:
            raise _err(path, key, str(exc)) from None
    if "vtcm_mb" in options and int(options["vtcm_mb"]) > info.vtcm_mb:
        raise _err(path, "provider_options.vtcm_mb",
                   f"{options['vtcm_mb']} MB exceeds the {info.vtcm_mb} MB VTCM of {info.name}")
    if options.get("htp_bf16_enable") == "1" and info.soc_model < 88:
        raise _err(path, "provider_options.htp_bf16_enable", f"bf16 needs soc_model >= 88 ({info.name} is "
                                                             f"{info.soc_model})")
    return options


def _check_placement(path: Path, given: Any) -> dict:
    place = _obj(path, given, "placement",
                 {g: str for g in G.PLACEMENT_KEYS if g not in G.OPTIONAL_PLACEMENT_KEYS},
                 {g: str for g in G.OPTIONAL_PLACEMENT_KEYS})
    for g, v in place.items():
        if v not in G.DEVICES:
            raise _err(path, f"placement.{g}", f"{v!r} is not one of {', '.join(G.DEVICES)}")
    return place


def parse_target(data: Any, path: Path) -> Target:
    path = Path(path)
    top = _obj(path, data, "", {
        "schema": str, "name": str, "description": str, "runs_on": str, "soc": dict, "precision": str,
        "provider_options": dict, "shapes": dict, "attention_mask_value": (int, float), "placement": dict},
        {"layer_placement": dict, "kv_dtype": str, "talker_graphs": str, "cost": dict, "process_context_mb": (int, float)})
    talker_graphs = top.get("talker_graphs", TALKER_GRAPHS[0])
    if talker_graphs not in TALKER_GRAPHS:
        raise _err(path, "talker_graphs", f"{talker_graphs!r} is not one of {', '.join(TALKER_GRAPHS)}")
    if top["schema"] != SCHEMA:
        raise _err(path, "schema", f"{top['schema']!r} is not supported (expected {SCHEMA!r})")
    if not top["name"] or not all(c.isalnum() or c in "-_." for c in top["name"]):
        raise _err(path, "name", f"{top['name']!r} must be a non-empty name of letters, digits, -_.")
    if top["runs_on"] not in RUNS_ON:
        raise _err(path, "runs_on", f"{top['runs_on']!r} is not one of {', '.join(RUNS_ON)}")

    soc = _obj(path, top["soc"], "soc", {"name": str, "soc_model": int, "htp_arch": int},
               {"marketing_name": str})
    info = _check_soc(path, soc)

    if top["precision"] not in G.HTP_PRECISIONS:
        raise _err(path, "precision", f"{top['precision']!r} is not one of {', '.join(G.HTP_PRECISIONS)}")

    try:
        kv = top.get("kv_dtype") and G.htp_kv_dtype(top["precision"], top["kv_dtype"])
    except ValueError as exc:
        raise _err(path, "kv_dtype", str(exc)) from None

    options = _check_provider_options(path, top["provider_options"], info)

    sh = _obj(path, top["shapes"], "shapes", {"prefill_chunk": int, "context": int, "decoder_chunk": int})
    shapes = Shapes(sh["prefill_chunk"], sh["context"], sh["decoder_chunk"])
    _check_shapes(path, shapes)

    mask = float(top["attention_mask_value"])
    if not -1e4 <= mask <= -10:
        raise _err(path, "attention_mask_value",
                   f"{mask} must be in -10000..-10: negative enough to mask, small enough for fp16 "
                   "and for 16-bit activation quantization")

    place = _check_placement(path, top["placement"])

    layers = top.get("layer_placement")
    if layers is not None:  # the layer count is the model's: check everything but that now
        try:
            parse_phases(layers, str(path), None, "layer_placement.")
        except PlacementError as exc:
            raise TargetError(str(exc)) from None
    cost = _check_cost(path, top.get("cost"), top["runs_on"])
    budget = top.get("process_context_mb")
    if budget is not None and (isinstance(budget, bool) or not 0 < budget < 1 << 20):
        raise _err(path, "process_context_mb", f"{budget!r} must be a positive number of MB (the graph files one "
                                               "process opens on the HTP)")
    return Target(name=top["name"], path=path, description=top["description"], runs_on=top["runs_on"], soc=info,
                  marketing_name=soc.get("marketing_name", ""), precision=top["precision"],
                  provider_options=options, shapes=shapes, attention_mask_value=mask,
                  placement=dict(place), layer_placement=layers, kv_dtype=kv or None, talker_graphs=talker_graphs,
                  cost=cost, process_context_mb=budget, raw=data)


def _check_cost(path: Path, cost: Any, runs_on: str) -> dict | None:
    """The ``cost`` figures: positive numbers, each with a non-empty source; none for a simulator."""
    if cost is None:
        return None
    if runs_on == "simulator":
        raise _err(path, "cost", "a simulator target takes no cost figures (its host times are not a device)")
    _obj(path, cost, "cost", {}, {**{k: (int, float) for k in COST_FIGURES},
                                  **{s: str for s in COST_FIGURES.values()}, "note": str})
    for k, src in COST_FIGURES.items():
        if k in cost and not cost[k] > 0:
            raise _err(path, f"cost.{k}", f"{cost[k]} must be a positive number")
        if k in cost and not cost.get(src, "").strip():
            raise _err(path, f"cost.{src}", f"missing: cost.{k} needs its public source (a URL and what it says)")
    return dict(cost)
