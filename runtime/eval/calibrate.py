"""``kztts calibrate``: measure where fp16 is unsafe in the Talker and what quantized weights cost each layer;
write a guarded placement and a per-layer precision plan.

The prompts run through the bundle's layer-segment graphs on the CPU in fp32 (every
layer on the CPU, ``kztts.runners.talker_segmented``), speaking for real: prompt, then frames
with the bundle's Code Predictor, so both phases see the activations generation
produces. Each graph reports the largest magnitude of its residual stream, norm
inputs and outputs, q/k/v projections, attention scores, MLP intermediate and
outputs (``kztts.bundle.segments.LAYER_STATS``); the report keeps the maximum per layer,
per phase.

Policy: a layer whose largest recorded magnitude reaches ``threshold`` runs on the
CPU in fp32 in that phase; the others go to the HTP. The default threshold,
``65504 / 8 = 8188`` (``DEFAULT_THRESHOLD``), leaves three bits of headroom below
fp16's largest value, because (a) unseen text can drive activations past what a
handful of calibration prompts showed (measured outliers on real LLMs vary by a
few x between prompts), (b) the HTP accumulates matmuls in fp16 too, so partial sums
can exceed the final value, and (c) at 8192 fp16's spacing is already 8, so a value
that large has lost the low bits of everything added to it.

Quantization sensitivity (``kztts.eval.sqnr``): beside the magnitudes, each layer graph's (and the head's)
output SQNR with its MatMul weights at every quantized HTP precision's bits (8 and 4) against fp32, and each
MatMul's (and, for a TTS bundle, each ``cp_frame`` MatMul's), on the same calls, on the CPU. The precision
plan (``precision_plan``): a unit flagged by its magnitudes on the CPU (fp32); else the least precise
quantized precision whose output SQNR reaches ``sqnr_threshold`` (w4a16 at or above it, else w8a16, the
floor); a MatMul of a unit whose own SQNR at the unit's precision is under ``matmul_sqnr_threshold`` one
precision up (its key in the plan's ``matmuls``), and ``cp_frame`` at the least precise precision all its
MatMuls clear that threshold at. The defaults (``DEFAULT_SQNR_THRESHOLD``, ``DEFAULT_MATMUL_SQNR_THRESHOLD``)
and the measurements behind them: docs/PRECISION.md, "Per-layer precision plans".

A hybrid LM (Qwen3-Next / Qwen3.5) has no layer graphs: its whole-stack static graphs run on the CPU in fp32
(``kztts.runners.hybrid_static``) and their probes give every layer's magnitudes, a DeltaNet layer's
``DELTANET_STATS`` (its recurrent state, conv output, delta-rule output, ...) beside the attention layers'
``LAYER_STATS``. Its placement is per phase (a phase runs whole on one device): a phase with a flagged layer
or head runs on the CPU, and a prefill on the CPU takes the decode with it (the HTP decode graph needs
the HTP prefill's cache).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kztts.bundle import graphs as G
from kztts.bundle.bundle import Bundle
from kztts.bundle.manifest import KIND_LM
from kztts.bundle.segments import DEFAULT_THRESHOLD, FP16_MAX, HEAD_STATS, LAYER_STATS
from kztts.core.audio import synthetic_voice
from kztts.core.cache import portable_path
from kztts.core.errors import ContextOverflowError, KzttsError
from kztts.core.progress import bar, phase
from kztts.eval.sqnr import DEFAULT_FEEDS, DEFAULT_ROWS, capture_session, capture_sessions, finish_call, measure_all
from kztts.htp.placement import PHASES, LayerPlacement, PhasePlacement, builtin
from kztts.lm.lm import LM
from kztts.plan.resolve import resolve_plan
from kztts.runners.code_predictor import CodePredictor
from kztts.runners.hybrid_static import HybridStaticTalker, layer_stat_names
from kztts.tts.tts import TTS

log = logging.getLogger(__name__)

DEFAULT_FRAMES = 16
REPORT_SCHEMA = "kztts-calibration/1"
# Precision-plan thresholds (dB): docs/PRECISION.md, "Per-layer precision plans", gives the measurements.
DEFAULT_SQNR_THRESHOLD = 10.0
DEFAULT_MATMUL_SQNR_THRESHOLD = 13.0


def default_prompts_file() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "calibration_prompts.json"


def load_prompts(path: str | Path | None = None) -> list[dict]:
    """Prompts as [{"text", "language", "streaming_text"}]: a JSON list of such objects (or of
    strings), or a text file with one prompt per line (``#`` comments and blank lines skipped)."""
    path = Path(path) if path is not None else default_prompts_file()
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KzttsError(f"{path}: cannot read the prompts file ({exc})") from exc
    if path.suffix.lower() == ".json":
        try:
            items = json.loads(raw)
        except ValueError as exc:
            raise KzttsError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(items, list):
            raise KzttsError(f"{path}: expected a JSON list of prompts")
    else:
        items = [ln.strip() for ln in raw.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    prompts = []
    for i, it in enumerate(items):
        if isinstance(it, str):
            it = {"text": it}
        if not isinstance(it, dict) or not isinstance(it.get("text"), str) or not it["text"].strip():
            raise KzttsError(f"{path}: prompt {i}: needs a non-empty 'text'")
        unknown = set(it) - {"text", "language", "streaming_text"}
        if unknown:
            raise KzttsError(f"{path}: prompt {i}: unknown keys {sorted(unknown)} (allowed: text, language, "
                             "streaming_text)")
        prompts.append({"text": it["text"], "language": it.get("language", "auto"),
                        "streaming_text": bool(it.get("streaming_text", False))})
    if not prompts:
        raise KzttsError(f"{path}: no prompts in the file")
    return prompts


@dataclass
class CalibrationReport:
    """Largest magnitudes per phase: ``layers[phase]`` [num_layers, len(LAYER_STATS)], ``head[phase]``."""

    bundle: str
    threshold: float
    layers: dict[str, np.ndarray]
    head: dict[str, np.ndarray]
    prompts: list[dict] = field(default_factory=list)
    frames: int = 0
    positions: dict[str, int] = field(default_factory=dict)
    stat_names: tuple | None = None  # per layer, the names of its stats (a hybrid's); None: LAYER_STATS
    # quantization sensitivity (None: not measured): {phase: {precision: [SQNR dB per layer, head last]}},
    # {phase: {precision: {MatMul key: dB}}}, cp_frame's {precision: {MatMul key: dB}}
    sqnr: dict | None = None
    matmul_sqnr: dict | None = None
    cp_sqnr: dict | None = None
    sqnr_threshold: float = DEFAULT_SQNR_THRESHOLD
    matmul_sqnr_threshold: float = DEFAULT_MATMUL_SQNR_THRESHOLD

    @property
    def num_layers(self) -> int:
        return self.layers["prefill"].shape[0]

    @property
    def whole_stack(self) -> bool:
        """A hybrid LM's report: its placement is per phase (no layer graphs)."""
        return self.stat_names is not None

    def names(self, layer: int) -> tuple[str, ...]:
        return self.stat_names[layer] if self.stat_names else LAYER_STATS

    def flagged(self, phase: str) -> list[int]:
        """Layers of ``phase`` whose largest magnitude reaches the threshold."""
        return [int(i) for i in np.nonzero(self.layers[phase].max(axis=1) >= self.threshold)[0]]

    def head_flagged(self, phase: str) -> bool:
        return bool(self.head[phase].max() >= self.threshold)

    def placement(self) -> LayerPlacement:
        """The guarded placement: flagged layers (and head) on the CPU, the rest on the HTP (a hybrid: each
        phase whole, on the CPU when any of it is flagged; a CPU prefill takes the decode with it)."""
        phases = []
        for ph in PHASES:
            bad = set(self.flagged(ph))
            if self.whole_stack:
                cpu = bad or self.head_flagged(ph) or (ph == "decode" and phases[0].head == "cpu")
                phases.append(PhasePlacement(("cpu" if cpu else "htp",) * self.num_layers, "cpu" if cpu else "htp"))
                continue
            phases.append(PhasePlacement(tuple("cpu" if i in bad else "htp" for i in range(self.num_layers)),
                                         "cpu" if self.head_flagged(ph) else "htp"))
        summary = {ph: {"cpu_layers": self.flagged(ph), "head_on_cpu": self.head_flagged(ph),
                        "peak": float(max(self.layers[ph].max(), self.head[ph].max()))} for ph in PHASES}
        return LayerPlacement("guarded", phases[0], phases[1], self.bundle,
                              {"threshold": self.threshold, "calibration": summary})

    # ------------------------------------------------------------ the precision plan
    def _pick(self, dbs: dict[str, float], threshold: float) -> str:
        """The least precise quantized precision whose SQNR in ``dbs`` reaches ``threshold``, else the most
        precise quantized one (the floor)."""
        for p in reversed(G.QUANTIZED_PRECISIONS):
            if dbs.get(p, -np.inf) >= threshold:
                return p
        return G.most_precise_quantized()

    def unit_precision(self, phase: str, unit) -> str:
        """``cpu`` for a unit flagged by its magnitudes, else its quantized precision by output SQNR."""
        flagged = self.head_flagged(phase) if unit == "head" else unit in self.flagged(phase)
        if flagged:
            return "cpu"
        i = self.num_layers if unit == "head" else int(unit)
        return self._pick({p: float(v[i]) for p, v in self.sqnr[phase].items()}, self.sqnr_threshold)

    def precision_plan(self) -> LayerPlacement:
        """The per-layer precision plan (module docstring); needs the SQNR measurement."""
        if self.sqnr is None:
            raise KzttsError("no quantization sensitivity measured: a precision plan needs kztts calibrate's SQNR "
                             "(run it without --no-sqnr, on a bundle with layer graphs)")
        phases, units = [], {}
        for ph in PHASES:
            labels = [self.unit_precision(ph, i) for i in range(self.num_layers)]
            head = self.unit_precision(ph, "head")
            units[ph] = labels + [head]
            phases.append(PhasePlacement(tuple("cpu" if x == "cpu" else "htp" for x in labels),
                                         "cpu" if head == "cpu" else "htp",
                                         tuple(None if x == "cpu" else x for x in labels),
                                         None if head == "cpu" else head))
        order = G.QUANTIZED_PRECISIONS
        matmuls: dict[str, str] = {}
        for ph in PHASES:
            for key in sorted({k for p in self.matmul_sqnr[ph].values() for k in p}):
                i = self.num_layers if key == "head" else int(key.split(".")[0])
                own = units[ph][i]
                if own == "cpu":
                    continue
                db = self.matmul_sqnr[ph].get(own, {}).get(key, np.inf)
                if db < self.matmul_sqnr_threshold and order.index(own) > 0:
                    up = order[order.index(own) - 1]
                    if key not in matmuls or order.index(up) < order.index(matmuls[key]):
                        matmuls[key] = up
        graphs = {}
        if self.cp_sqnr:
            graphs["cp_frame"] = self._pick({p: min(d.values()) for p, d in self.cp_sqnr.items() if d},
                                            self.matmul_sqnr_threshold)
        info = {"threshold": self.threshold, "sqnr_threshold_db": self.sqnr_threshold,
                "matmul_sqnr_threshold_db": self.matmul_sqnr_threshold,
                "calibration": {ph: {"cpu_layers": self.flagged(ph), "head_on_cpu": self.head_flagged(ph),
                                     "precisions": {p: units[ph].count(p) for p in sorted(set(units[ph]))}}
                                for ph in PHASES}}
        return LayerPlacement("guarded", phases[0], phases[1], self.bundle, info, graphs, matmuls)

    def to_json(self) -> dict:
        phases = {}
        for ph in PHASES:
            rows = []
            for i, row in enumerate(self.layers[ph]):
                k = int(np.argmax(row))
                rows.append({"layer": i, "max_abs": dict(zip(self.names(i), map(float, row))), "peak": float(row[k]),
                             "peak_tensor": self.names(i)[k], "flagged": bool(row[k] >= self.threshold),
                             **self._sqnr_json(ph, i)})
            head = self.head[ph]
            phases[ph] = {"positions": self.positions.get(ph, 0), "layers": rows,
                          "head": {"max_abs": dict(zip(HEAD_STATS, map(float, head))),
                                   "flagged": self.head_flagged(ph), **self._sqnr_json(ph, "head")}}
        out = {"schema": REPORT_SCHEMA, "bundle": portable_path(self.bundle), "threshold": self.threshold,
               "fp16_max": FP16_MAX,
               "frames": self.frames, "prompts": self.prompts, "phases": phases,
               "flagged": {ph: self.flagged(ph) for ph in PHASES}}
        if self.sqnr is not None:
            out.update(sqnr_threshold_db=self.sqnr_threshold, matmul_sqnr_threshold_db=self.matmul_sqnr_threshold,
                       sqnr_precisions={p: G.htp_precision(p).weight_bits for p in self.sqnr[PHASES[0]]},
                       plan=self.precision_plan().to_json())
            if self.cp_sqnr:
                out["cp_frame_matmul_sqnr_db"] = self.cp_sqnr
        return out

    def _sqnr_json(self, phase: str, unit) -> dict:
        if self.sqnr is None:
            return {}
        i = self.num_layers if unit == "head" else int(unit)
        prefix = "head" if unit == "head" else f"{unit}."
        return {"sqnr_db": {p: float(v[i]) for p, v in self.sqnr[phase].items()},
                "matmul_sqnr_db": {p: {k: v for k, v in d.items() if (k == "head" if unit == "head"
                                                                          else k.startswith(prefix))}
                                   for p, d in self.matmul_sqnr[phase].items()},
                "precision": self.unit_precision(phase, unit)}

    def plot(self, path: str | Path) -> Path | None:
        """Per-layer magnitudes against the fp16 limit and the threshold (PNG); None without matplotlib."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log.warning("matplotlib is not installed: no plot (pip install matplotlib)")
            return None
        groups = {"residual stream": ("residual_in", "residual_mid", "residual_out"),
                  "norm outputs": ("attn_norm_out", "mlp_norm_out"), "q/k/v projections": ("qkv_proj",),
                  "attention scores": ("attn_scores",), "attention output": ("attn_out",),
                  "MLP intermediate": ("mlp_intermediate",), "MLP output": ("mlp_out",)}
        if self.whole_stack:
            groups["DeltaNet state"] = ("recurrent_state",)
            groups["DeltaNet conv / core"] = ("in_proj", "conv_out", "core_out", "gated_norm_out")
        rows = 2 if self.sqnr is not None else 1
        fig, grid = plt.subplots(rows, 2, figsize=(12, 4.5 * rows), squeeze=False)
        axes = grid[0]
        x = np.arange(self.num_layers)
        for ax, ph in zip(axes, PHASES):
            data = self.layers[ph]
            for label, names in groups.items():
                vals = np.array([max([row[k] for k, n in enumerate(self.names(i)) if n in names] or [np.nan])
                                 for i, row in enumerate(data)], dtype=float)
                ax.plot(x, np.maximum(vals, 1e-3), marker="o", ms=3, label=label)
            ax.scatter([self.num_layers], [max(self.head[ph][0], 1e-3)], marker="s", color="k", label="head input")
            ax.axhline(FP16_MAX, color="r", ls="-", lw=1, label="fp16 max (65504)")
            ax.axhline(self.threshold, color="r", ls="--", lw=1, label=f"threshold ({self.threshold:g})")
            for i in self.flagged(ph):
                ax.axvspan(i - 0.4, i + 0.4, color="r", alpha=0.12)
            ax.set_yscale("log")
            ax.set_title(f"{ph}: largest |x| per layer (fp32 CPU)")
            ax.set_xlabel("layer (last point: head)")
        axes[0].set_ylabel("max |activation|")
        axes[1].legend(fontsize=7, loc="lower right")
        if self.sqnr is not None:
            self._plot_sqnr(grid[1])
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


    def _plot_sqnr(self, axes) -> None:
        """Per layer (head last): the output SQNR at each quantized precision, each MatMul's at the least precise
        one (dots), the thresholds, and the plan's precision per layer."""
        x = np.arange(self.num_layers + 1)
        low = G.QUANTIZED_PRECISIONS[-1]
        for ax, ph in zip(axes, PHASES):
            for p, v in self.sqnr[ph].items():
                ax.plot(x, v, marker="o", ms=3, color=G.PRECISION_COLOURS.get(p),
                        label=f"layer output, {G.htp_precision(p).weight_bits}-bit weights ({p})")
            pts = [(self.num_layers if k == "head" else int(k.split(".")[0]), db)
                   for k, db in self.matmul_sqnr[ph].get(low, {}).items()]
            if pts:
                ax.scatter(*zip(*pts), s=8, color="grey", alpha=0.6, label=f"each MatMul ({low})")
            ax.axhline(self.sqnr_threshold, color="k", ls="--", lw=1, label=f"layer threshold ({self.sqnr_threshold:g} dB)")
            ax.axhline(self.matmul_sqnr_threshold, color="k", ls=":", lw=1,
                       label=f"MatMul threshold ({self.matmul_sqnr_threshold:g} dB)")
            for i in range(self.num_layers + 1):
                unit = "head" if i == self.num_layers else i
                p = self.unit_precision(ph, unit)
                if p != low:
                    ax.axvspan(i - 0.4, i + 0.4, color=G.PRECISION_COLOURS.get(p, "r") if p != "cpu" else "r",
                               alpha=0.12)
            ax.set_title(f"{ph}: weight quantization SQNR vs fp32 (CPU; shaded: not {low})")
            ax.set_xlabel("layer (last point: head)")
        axes[0].set_ylabel("SQNR (dB)")
        axes[1].legend(fontsize=7, loc="lower right")


def _lm_speaker(bundle, talker, tokens: int, seed: int):
    """An LM bundle's calibration run: each prompt as a chat message (empty system prompt: the layer graphs
    have a small static context), then ``tokens`` sampled reply tokens."""
    lm = LM(bundle, talker=talker)

    def speak(p: dict, i: int) -> None:
        for _ in lm.chat_session(system="").send(p["text"], tokens, seed=seed + i):
            pass
    return speak


def _hybrid_talker(bundle, m) -> HybridStaticTalker:
    """A hybrid LM's static graphs on the CPU EP (fp32), unguarded: calibration measures."""
    pre, dec = G.HYBRID_STATIC_GRAPHS
    how = "kztts export HYBRID_DIR -o BUNDLE --target TARGET"
    G.require(m, pre, feature="kztts calibrate of a hybrid LM (its static graphs' probes)", how=how)
    G.require(m, dec, feature="kztts calibrate of a hybrid LM (its static graphs' probes)", how=how)
    plan = resolve_plan(bundle, placement=builtin("all-cpu", int(m.talker["num_layers"])))
    return HybridStaticTalker(plan.session(pre, "cpu"), plan.session(dec, "cpu"), m.talker,
                              float(m.graphs[pre].extra.get("mask_value", -50.0)))


def calibrate(bundle_dir: str | Path, prompts: list[dict] | None = None, *, frames: int = DEFAULT_FRAMES,
              threshold: float = DEFAULT_THRESHOLD, seed: int = 0, progress: bool = False, sqnr: bool = True,
              sqnr_threshold: float = DEFAULT_SQNR_THRESHOLD,
              matmul_sqnr_threshold: float = DEFAULT_MATMUL_SQNR_THRESHOLD, sqnr_feeds: int = DEFAULT_FEEDS,
              sqnr_rows: int = DEFAULT_ROWS) -> CalibrationReport:
    """Run ``prompts`` (default: the shipped multilingual set) through the fp32 layer graphs of
    ``bundle_dir`` and record the magnitudes and (``sqnr``) the quantization sensitivity, keeping at most
    ``sqnr_feeds`` calls and ``sqnr_rows`` MatMul input rows per graph (module docstring)."""
    if not threshold > 0:
        raise KzttsError(f"threshold must be positive, got {threshold}")
    if sqnr_feeds < 1 or sqnr_rows < 1:
        raise KzttsError(f"--sqnr-feeds and --sqnr-rows must be at least 1, got {sqnr_feeds} and {sqnr_rows}")
    prompts = prompts if prompts is not None else load_prompts()
    bundle = Bundle.open(bundle_dir, load_graphs=False)  # the graphs used are opened (and checked) below
    m = bundle.manifest
    L = int(m.talker["num_layers"])
    hybrid = m.hybrid
    talker = _hybrid_talker(bundle, m) if hybrid else \
        resolve_plan(bundle, placement=builtin("all-cpu", L), segments=True).open_talker()
    if sqnr and hybrid:
        log.warning("%s: a hybrid LM has no layer graphs: no quantization sensitivity measured", bundle_dir)
        sqnr = False
    captures = capture_sessions(talker, bundle, sqnr_feeds, sqnr_rows) if sqnr else {}
    speak = _lm_speaker(bundle, talker, frames, seed) if m.kind == KIND_LM else None
    tts = TTS(bundle, talker=talker) if speak is None else None
    cp_capture = None
    if sqnr and tts is not None and "cp_frame" in m.graphs:  # the Code Predictor's MatMuls, on the CPU
        cp_session, cp_capture = capture_session(bundle.session("cp_frame"), bundle, "cp_frame", sqnr_rows)
        tts.code_predictor = CodePredictor({"cp_frame": cp_session}, m.code_predictor, m.talker, tts.tables)
    names = layer_stat_names(m.talker["layer_types"]) if hybrid else None
    layers = {ph: np.zeros((L, max(map(len, names)) if names else len(LAYER_STATS))) for ph in PHASES}
    head = {ph: np.zeros(len(HEAD_STATS)) for ph in PHASES}
    positions = {ph: 0 for ph in PHASES}

    def record(phase: str, unit, out: dict) -> None:
        if captures:
            finish_call(captures[(phase, unit)], int(out["hidden"].shape[0]))
        stats = np.asarray(out["stats"], np.float64)
        if unit == "head":
            np.maximum(head[phase], stats, out=head[phase])
            positions[phase] += int(out["hidden"].shape[0])
        else:
            np.maximum(layers[phase][unit], stats, out=layers[phase][unit])

    def record_stack(phase: str, layer_stats: np.ndarray, head_stats: np.ndarray, n: int) -> None:
        np.maximum(layers[phase], np.asarray(layer_stats, np.float64), out=layers[phase])
        np.maximum(head[phase], np.asarray(head_stats, np.float64), out=head[phase])
        positions[phase] += n

    if hybrid:
        talker.on_stats = record_stack
    else:
        talker.on_unit = record
    if speak is None:
        voice = tts.voice_from_wav(synthetic_voice(), 24000)

        def speak(p: dict, i: int) -> None:
            tts.generate_codes(p["text"], voice, language=p["language"], streaming_text=p["streaming_text"],
                               seed=seed + i, max_frames=frames)
    used = []
    it = prompts
    if progress:
        phase("calibrate: %d prompts of %d frames on the %s", len(prompts), frames,
              "whole-stack static graphs (CPU, fp32)" if hybrid else "per-layer graphs")
        it = bar(prompts, desc="calibrate", unit="prompt")
    for i, p in enumerate(it):
        try:
            speak(p, i)
        except ContextOverflowError as exc:
            log.warning("calibration prompt %d skipped: %s", i, exc)
            continue
        used.append(p)
    if not used:
        raise KzttsError(f"no calibration prompt fits the layer graphs' context ({talker.context} positions); "
                         "use shorter prompts or export with a larger shapes.context")
    report = CalibrationReport(str(bundle_dir), float(threshold), layers, head, used, frames, positions, names,
                               sqnr_threshold=float(sqnr_threshold), matmul_sqnr_threshold=float(matmul_sqnr_threshold))
    if captures:
        if progress:
            phase("calibrate: weight quantization SQNR of %d graphs at %s (CPU)", len(captures) + bool(cp_capture),
                  ", ".join(G.QUANTIZED_PRECISIONS))
        measure_all({**captures, **({"cp": cp_capture} if cp_capture else {})}, progress)
        report.sqnr = {ph: {p: np.array([captures[(ph, u)].sqnr[p] for u in [*range(L), "head"]])
                            for p in G.QUANTIZED_PRECISIONS} for ph in PHASES}
        report.matmul_sqnr = {ph: {p: {k: v for u in [*range(L), "head"] for k, v in
                                       captures[(ph, u)].matmul_sqnr[p].items()} for p in G.QUANTIZED_PRECISIONS}
                              for ph in PHASES}
        report.cp_sqnr = cp_capture.matmul_sqnr if cp_capture else None
    return report
