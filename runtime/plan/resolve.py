"""The execution plan decided: for every graph a job runs, its device, precision, threads and why.

One resolver, :func:`resolve_plan`, takes (bundle, target, layer placement, Code Predictor
mode, attention, strict) and decides everything; ``TTS``, validation, calibration and the
bench open their sessions through the plan it returns. Rules, in order:

- a Talker layer placement (``--placement``) decides the Talker's runner; without one the
  target's ``talker_prefill`` / ``talker_decode`` keys do; without a target, the CPU;
- the Code Predictor, decoder and speaker encoder follow the target's ``cp_frame``,
  ``decoder`` and ``speaker_encoder`` keys; a placement that decodes on the CPU keeps the
  Code Predictor (per-frame decode work) on the CPU as well;
- HTP work needs the bundle's static graph for it: when it is missing, strict mode refuses
  (naming the export command), otherwise the CPU graph runs and the plan says why;
- on the CPU the fused-attention graphs are preferred when the bundle has them
  (``KZTTS_ATTENTION=plain`` or ``attention="plain"`` keeps the plain ones).
"""
from __future__ import annotations

import json
import logging
from functools import cached_property
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.bundle.manifest import KIND_LM
from kztts.bundle.segments import segment_graph_name
from kztts.core import env
from kztts.core.errors import BundleError, KzttsError
from kztts.htp.placement import (
    BUILTIN_MODES,
    MODES,
    LayerPlacement,
    PlacementError,
    builtin,
    parse_placement,
)
from kztts.htp.qnn import bundle_target
from kztts.htp.qnn_package import check_target_skel
from kztts.htp.targets import SCHEMA as TARGET_SCHEMA
from kztts.htp.targets import Target, TargetError, load_target, target_path
from kztts.plan.execution import ExecutionPlan, Step

log = logging.getLogger(__name__)

ATTENTION_ENV = "KZTTS_ATTENTION"  # "plain" keeps the plain CPU graphs (A/B measurements)


def attention_from_env() -> str:
    """``$KZTTS_ATTENTION`` (default ``fused``), checked."""
    return env.choice(ATTENTION_ENV, G.ATTENTIONS, "fused")


# ---------------------------------------------------------------- resolution
def resolve_placement(spec: "str | Path | LayerPlacement", num_layers: int) -> LayerPlacement:
    """A mode name, a placement file, or a qnn_configs target (name or file) with ``layer_placement``."""
    if isinstance(spec, LayerPlacement):
        if spec.num_layers != num_layers:
            raise PlacementError(f"placement {spec.source or spec.mode} is for {spec.num_layers} layers, "
                                 f"the Talker has {num_layers}")
        return spec
    s = str(spec)
    if s in MODES:
        return builtin(s, num_layers)
    path = Path(s)
    if not path.is_file():
        try:
            path = target_path(s)
        except TargetError:
            raise PlacementError(f"placement {s!r}: not a mode ({', '.join(BUILTIN_MODES)}), a placement file, "
                                 "or a qnn_configs target") from None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PlacementError(f"{path}: not a readable JSON file ({exc})") from exc
    if isinstance(data, dict) and data.get("schema") == TARGET_SCHEMA:
        return load_target(path).layer_placement_for(num_layers)
    return parse_placement(data, str(path), num_layers)


class _Resolver:
    def __init__(self, bundle, target: Target | None, placement: LayerPlacement | None, strict: bool, cp_mode: str,
                 attention: str, segments: bool, host_check: bool = True):
        self.bundle, self.m = bundle, bundle.manifest
        self.host_check = host_check
        self.segments = segments
        self.target, self.placement, self.strict = target, placement, strict
        self.cp_mode, self.attention = cp_mode, attention

    def has(self, graph: str) -> bool:
        return graph in self.m.graphs

    def cfg_threads(self, graph: str) -> int:
        return self.bundle.session_config.threads_for(graph)

    def precision(self, graph: str, device: str) -> str:
        spec = self.m.graphs.get(graph)
        if spec is None:
            return "-"
        variant = self.m.data.get("variant") or {}
        p = spec.precision
        if device == "htp":
            entry = G.HTP_PRECISION_ENTRIES.get(p)
            return f"{p} (htp)" if entry is not None and entry.quantized else f"{G.FLOAT_HTP_PRECISION} (htp)"
        p = spec.extra.get("cpu_precision", p)
        if p in ("fp32", "fp16") and variant:
            role = G.GRAPHS.get(graph, G.GRAPHS["talker"]).role
            weights = variant.get("decoder") if role == "decoder" else variant.get("weights")
            if weights and weights != "fp32" and role in ("talker", "code_predictor", "decoder"):
                p = weights
        kv = spec.extra.get("kv_dtype")
        return f"{p} (cpu{', kv ' + kv if kv else ''})"

    def step(self, role: str, graphs: list[str], device: str, reason: str) -> Step:
        g0 = graphs[0] if graphs else "-"
        return Step(role, tuple(graphs), device, self.precision(g0, device), self.cfg_threads(g0), reason)

    def target_says(self, key: str) -> str:
        if self.target is None:
            return "cpu"
        return self.target.placement.get(key, "cpu")

    def htp_or_fallback(self, role: str, graph: str, key: str, cpu_graphs: list[str]) -> Step:
        """``graph`` on the HTP when the bundle has it; else strict: an error, else the CPU graphs."""
        where = f"target {self.target.name}: placement.{key}=htp"
        if self.htp_refusal:
            return self.step(role, cpu_graphs, "cpu", f"fallback: {self.htp_refusal}")
        if self.has(graph):
            if role == "talker_decode" and graph == "talker_prefill":
                where += "; decode steps as padded prefill chunks (talker_graphs prefill-only)"
            return self.step(role, [graph], "htp", where)
        how = G.GRAPHS[graph].exported_by if graph in G.GRAPHS else G.SEGMENT_EXPORT
        if self.strict:
            raise BundleError(f"{self.m.path}: {where}, but the bundle has no static graph {graph!r}; re-export "
                              f"it with `{how.replace('TARGET', self.target.name)}` (or run without --strict: "
                              f"the CPU then runs it)")
        log.warning("%s, but the bundle has no static graph %r: running %s on the CPU (%s)", where, graph, role,
                    ", ".join(cpu_graphs))
        return self.step(role, cpu_graphs, "cpu", f"fallback: {where} but no {graph!r} graph in the bundle")

    @cached_property
    def htp_refusal(self) -> str | None:
        """Why this machine's QNN package cannot run the target's HTP (no skel for its arch), else None;
        strict mode raises (``kztts.htp.qnn_package``). Asked once a target is known; not when the plan is
        the device's (``host_check`` False: ``kztts pack`` plans for a machine other than this one)."""
        return check_target_skel(self.target, self.strict) if self.host_check else None

    def cpu_graph(self, plain: str, fused: str) -> tuple[str, str]:
        if self.attention == "fused" and self.has(fused):
            return fused, f"CPU, fused attention ({fused} in the bundle)"
        if self.attention == "fused":
            return plain, f"CPU, plain attention (no {fused} in the bundle)"
        return plain, f"CPU, plain attention ({ATTENTION_ENV}=plain)"

    # ------------------------------------------------------------ roles
    def talker(self) -> tuple[str, Step, Step]:
        if self.m.hybrid:
            return self.hybrid_talker()
        cpu_graph, cpu_why = self.cpu_graph("talker", "talker_gqa")
        if self.placement is not None:
            pl = self.placement
            why = f"placement {pl.source or pl.mode}"
            if pl.uniform() != "cpu":
                self._need_target(why)
                if self.htp_refusal:
                    why = f"{why}, fallback: {self.htp_refusal}"
                    pl = self.placement = builtin("all-cpu", pl.num_layers)
            if pl.quantized and not self.has(segment_graph_name("prefill", 0)) and self.has("talker_prefill") \
                    and not self.segments:
                self._check_whole_stack_plan(pl)
                why = f"{why}: whole-stack graphs exported with its precisions"
                pl = builtin("all-htp", pl.num_layers)
                pre = dec = "htp"
            else:
                pre, dec = pl.uniform("prefill"), pl.uniform("decode")
                if pl.quantized_units():  # a precision per unit: the QDQ layer graphs, whatever the devices
                    pre = dec = None
            if pre == dec == "cpu" and not self.segments:
                return "cpu", self.step("talker_prefill", [cpu_graph], "cpu", f"{why}: all on the CPU"), \
                    self.step("talker_decode", [cpu_graph], "cpu", f"{why}: all on the CPU")
            if pre == "htp" and dec in ("htp", "cpu") and not self.segments:
                self._need_target(why)
                G.require(self.m, "talker_prefill", feature=f"Talker prefill on the HTP ({why})")
                pre_step = self.step("talker_prefill", ["talker_prefill"], "htp", why)
                G.require(self.m, self.decode_graph(), feature=f"the static Talker ({why})")
                if dec == "htp":
                    return "static", pre_step, self.step("talker_decode", [self.decode_graph()], "htp", why)
                return "handover", pre_step, self.step("talker_decode", [cpu_graph], "cpu",
                                                       f"{why}: decode on the CPU (KV handed over)")
            if any(d == "htp" for ph in ("prefill", "decode") for d in pl.phase(ph).devices):
                self._need_target(why)
            G.require(self.m, segment_graph_name("prefill", 0), feature=f"a per-layer placement ({why})",
                      how=G.SEGMENT_EXPORT)
            steps = []
            for ph in ("prefill", "decode"):
                segs = pl.segments(ph)
                names = [pl.unit_graph(ph, u) for s in segs for u in s.units]
                for n in names:
                    G.require(self.m, n, feature=f"a per-layer precision plan ({why})",
                              how=G.SEGMENT_EXPORT + f" --placement {pl.source or 'PLAN'}")
                devs = sorted({s.device for s in segs})
                desc = "; ".join(f"{s.label} on {s.device}" for s in segs)
                htp = sorted({pl.phase(ph).precision(u) or G.FLOAT_HTP_PRECISION for s in segs if s.device == "htp"
                              for u in s.units}, key=G.HTP_PRECISIONS.index)
                prec = " / ".join(([f"{G.CPU_PRECISION} (cpu)"] if "cpu" in devs else [])
                                  + ([f"{'+'.join(htp)} (htp)"] if htp else []))
                steps.append(Step(f"talker_{ph}", tuple(names), "+".join(devs), prec,
                                  self.cfg_threads(names[0]), f"{why}: {desc}"))
            return "segments", steps[0], steps[1]
        pre, dec = self.target_says("talker_prefill"), self.target_says("talker_decode")
        if pre == "cpu" and dec == "cpu":
            why = cpu_why if self.target is None else f"target {self.target.name}: Talker on the CPU; {cpu_why}"
            return "cpu", self.step("talker_prefill", [cpu_graph], "cpu", why), \
                self.step("talker_decode", [cpu_graph], "cpu", why)
        if pre == "cpu":
            raise KzttsError(f"{self.target.path}: placement.talker_prefill=cpu with placement.talker_decode=htp "
                             "is not supported (the HTP decode graph needs the prompt's KV in its own layout); "
                             "put talker_prefill on the HTP too, or decode on the CPU")
        fallback = [cpu_graph]
        p = self.htp_or_fallback("talker_prefill", "talker_prefill", "talker_prefill", fallback)
        if dec == "htp":
            d = self.htp_or_fallback("talker_decode", self.decode_graph(), "talker_decode", fallback)
        else:
            d = self.step("talker_decode", [cpu_graph], "cpu",
                          f"target {self.target.name}: placement.talker_decode=cpu; {cpu_why}")
        if p.device == "cpu":
            # without the prefill graph there is nothing to hand over: the whole Talker on the CPU; the decode step
            # says its own reason (its own missing graph, or the prefill it must follow)
            why = d.reason if d.device == "cpu" else (f"{d.reason}, but the prefill runs on the CPU (no "
                                                      "'talker_prefill' graph): decode stays with its KV cache there")
            return "cpu", p, self.step("talker_decode", [cpu_graph], "cpu", why)
        if d.device == "htp":
            return "static", p, d
        G.require(self.m, self.decode_graph(), feature="the HTP prefill's prompt tail (handover to CPU decode)")
        return "handover", p, d

    def _check_whole_stack_plan(self, pl: LayerPlacement) -> None:
        """A quantized plan on a bundle without layer graphs runs its whole-stack graphs when they were exported
        with the plan's precisions (``kztts export --target T --placement P``); else one line says so."""
        spec = self.m.graphs["talker_prefill"]
        exported = spec.extra.get("matmul_precisions", {})
        for key, want in pl.whole_stack_precisions().items():
            have = exported.get(key, spec.precision)
            if have != want:
                raise PlacementError(f"placement {pl.source or pl.mode} runs MatMul {key} at {want}, but this bundle's "
                                     f"whole-stack graphs have it at {have} and no layer graphs: re-export with "
                                     f"`kztts export MODEL -o BUNDLE --target TARGET --placement {pl.source or 'PLAN'}` "
                                     "(whole-stack) or with --segments")

    def hybrid_talker(self) -> tuple[str, Step, Step]:
        """A hybrid LM (``kztts.runners.hybrid``, ``hybrid_static``): each phase whole on one device. Runners
        ``hybrid-cpu``, ``hybrid-static`` (both phases on the HTP) and ``hybrid-handover`` (prefill on the HTP,
        its states and KV handed to the CPU decode)."""
        (pre_cpu, dec_cpu), (pre_htp, dec_htp) = G.HYBRID_CPU_GRAPHS, G.HYBRID_STATIC_GRAPHS
        if self.segments:
            raise KzttsError(f"{self.m.path}: a hybrid LM has no per-layer graphs (its whole-stack static graphs carry "
                             "every layer's probes); it runs each phase whole on one device")
        if self.placement is not None:
            pl = self.placement
            why = f"placement {pl.source or pl.mode}"
            pre, dec = pl.uniform("prefill"), pl.uniform("decode")
            if pre is None or dec is None:
                raise PlacementError(f"{why} splits a phase's layers between the CPU and the HTP; a hybrid LM "
                                     "(qwen3_next) has no per-layer graphs and runs each phase whole on one device: "
                                     "use all-cpu, all-htp or prefill-htp-decode-cpu (or a placement file whose "
                                     "phases are each on one device)")
            if "htp" in (pre, dec):
                self._need_target(why)
                if self.htp_refusal:
                    why, pre, dec = f"{why}, fallback: {self.htp_refusal}", "cpu", "cpu"
        else:
            pre, dec = self.target_says("talker_prefill"), self.target_says("talker_decode")
            why = "CPU" if self.target is None else f"target {self.target.name}"
        if pre == "cpu" and dec == "htp":
            raise KzttsError(f"{why}: prefill on the CPU with decode on the HTP is not supported (the HTP decode "
                             "graph needs the prompt's cache in its own layout); put the prefill on the HTP too, "
                             "or decode on the CPU")
        cpu_pre = self.step("talker_prefill", [pre_cpu], "cpu", f"{why}: the chunked delta rule on the CPU")
        cpu_dec = self.step("talker_decode", [dec_cpu], "cpu", f"{why}: the recurrent delta rule on the CPU")
        if pre == "cpu":
            return "hybrid-cpu", cpu_pre, cpu_dec
        if self.placement is not None:
            G.require(self.m, pre_htp, feature=f"hybrid prefill on the HTP ({why})")
            p = self.step("talker_prefill", [pre_htp], "htp", why)
        else:
            p = self.htp_or_fallback("talker_prefill", pre_htp, "talker_prefill", [pre_cpu])
        if p.device == "cpu":  # nothing to hand over: the whole stack on the CPU
            return "hybrid-cpu", p, self.step("talker_decode", [dec_cpu], "cpu", p.reason)
        if dec == "cpu":
            return "hybrid-handover", p, self.step(
                "talker_decode", [dec_cpu, pre_cpu], "cpu", f"{why}: decode on the CPU, every DeltaNet state and "
                "attention KV handed over (later chat turns: hybrid_prefill on the CPU)")
        if self.placement is not None:
            G.require(self.m, dec_htp, feature=f"hybrid decode on the HTP ({why})")
            return "hybrid-static", p, self.step("talker_decode", [dec_htp], "htp", why)
        d = self.htp_or_fallback("talker_decode", dec_htp, "talker_decode", [dec_cpu])
        return ("hybrid-static" if d.device == "htp" else "hybrid-handover"), p, d

    def decode_graph(self) -> str:
        """The static graph of HTP decode steps: ``talker_prefill`` itself (``kztts.runners.talker_prefill_only``)
        when the target says ``talker_graphs: prefill-only`` or the bundle has no decode graph."""
        only = self.target is not None and self.target.talker_graphs == "prefill-only"
        if self.has("talker_prefill") and (only or not self.has("talker_decode")):
            return "talker_prefill"
        return "talker_decode"

    def _need_target(self, why: str) -> None:
        """HTP work without a target runs on the target the bundle's static graphs were made for."""
        if self.target is None:
            try:
                self.target = load_target(bundle_target(self.bundle))
            except KzttsError:
                raise KzttsError(f"{why} puts Talker work on the HTP: give --target (a qnn_configs target)") from None

    def code_predictor(self) -> Step:
        if self.cp_mode not in G.CP_MODES:
            raise KzttsError(f"code predictor mode {self.cp_mode!r} is not one of {', '.join(G.CP_MODES)}")
        if self.cp_mode == "step":
            cpu = ("cp_step", "CPU, one run per codebook (cp_mode step)")
        else:
            cpu = self.cpu_graph("cp_frame", "cp_frame_gqa")
        if self.target_says("cp_frame") == "htp":
            if self.placement is not None and self.placement.uniform("decode") == "cpu":
                return self.step("code_predictor", [cpu[0]], "cpu",
                                 f"placement decodes on the CPU, so the Code Predictor (decode work) too; {cpu[1]}")
            # cp_frame is a static graph in every bundle: it needs no --target export
            return self.htp_or_fallback("code_predictor", "cp_frame", "cp_frame", [cpu[0]])
        why = cpu[1] if self.target is None else f"target {self.target.name}: placement.cp_frame=cpu; {cpu[1]}"
        return self.step("code_predictor", [cpu[0]], "cpu", why)

    def decoder(self) -> Step:
        cpu = "decoder_stream" if self.has("decoder_stream") else "decoder"
        cpu_why = "CPU" + ("" if cpu == "decoder_stream" else " (no decoder_stream graph: whole-utterance only)")
        if self.target_says("decoder") == "htp":
            return self.htp_or_fallback("decoder", "decoder_chunk", "decoder", [cpu])
        why = cpu_why if self.target is None else f"target {self.target.name}: placement.decoder=cpu"
        return self.step("decoder", [cpu], "cpu", why)

    def speaker_encoder(self) -> Step:
        if self.target_says("speaker_encoder") == "htp":
            # kztts exports no static speaker-encoder graph (its input length varies with the recording)
            return self.htp_or_fallback("speaker_encoder", "speaker_encoder_static", "speaker_encoder",
                                        ["speaker_encoder"])
        return self.step("speaker_encoder", ["speaker_encoder"], "cpu", "CPU (dynamic-length input)")

    def speech_encoder(self) -> Step:
        return self.step("speech_encoder", ["encoder"], "cpu", "CPU (dynamic-length input; no HTP graph kind)")


def check_target_graphs(manifest, target: Target) -> None:
    """Refuse, in one line, a ``target`` that puts the Talker on the HTP of a bundle with no static Talker graph at
    all (exported without ``--target``): everything would fall back to the CPU but the plain ``cp_frame``, which the
    HTP simulator runs far slower than real time. A bundle with some of the graphs falls back per graph, each
    step's reason saying where it runs and why (``resolve_plan``)."""
    if target.placement.get("talker_prefill", "cpu") != "htp" or manifest.hybrid:
        return
    graphs = manifest.graphs
    if "talker_prefill" in graphs or "talker_decode" in graphs or segment_graph_name("prefill", 0) in graphs:
        return
    raise BundleError(f"{manifest.path}: target {target.name} runs the Talker from static HTP graphs, which this "
                      f"bundle lacks (exported without --target); add them with "
                      f"`kztts export MODEL_DIR -o BUNDLE --target {target.name}`, or leave out --target to run on "
                      "the CPU")


def resolve_plan(bundle, *, target: "str | Path | Target | None" = None,
                 placement: "str | LayerPlacement | None" = None, strict: bool = False, cp_mode: str = "frame",
                 attention: str | None = None, segments: bool = False, check_saturation: bool = False,
                 host_check: bool = True) -> ExecutionPlan:
    """Decide where every role of a synthesis runs (module docstring); nothing is opened yet.
    ``target``: a qnn_configs target (name, file or ``Target``), resolved here once: the plan and
    everything it opens carry the ``Target`` (``plan.target``).
    ``segments``: run the Talker as its per-layer graphs even when the placement is uniform
    (calibration and per-segment validation read every layer's outputs). ``check_saturation``
    (synthesis): a placement with Talker work on the HTP runs the per-layer graphs when the bundle
    has them, since their magnitude probes are checked on every call (``kztts.htp.saturation``). ``host_check``
    False: the plan of the target's own device, whatever this machine's QNN package can run (``kztts pack``)."""
    if target is not None:
        target = load_target(target)
    if placement is not None:
        placement = resolve_placement(placement, int(bundle.manifest.talker["num_layers"]))
    attention = attention or attention_from_env()
    if attention not in G.ATTENTIONS:
        raise KzttsError(f"attention {attention!r} is not one of {', '.join(G.ATTENTIONS)}")
    if segments and placement is None:
        raise KzttsError("the per-layer Talker needs a placement (e.g. all-cpu)")
    if check_saturation and placement is not None and segment_graph_name("prefill", 0) in bundle.manifest.graphs \
            and "htp" in placement.devices:
        segments = True  # the whole-Talker HTP graphs carry no probes
    r = _Resolver(bundle, target, placement, strict, cp_mode, attention, segments, host_check)
    runner, pre, dec = r.talker()
    steps = {"talker_prefill": pre, "talker_decode": dec}
    if bundle.manifest.kind != KIND_LM:  # an LM bundle (kztts.lm.lm) is the decoder stack alone
        steps.update(code_predictor=r.code_predictor(), decoder=r.decoder(), speaker_encoder=r.speaker_encoder(),
                     speech_encoder=r.speech_encoder())
    return ExecutionPlan(bundle, r.target, r.placement, strict, cp_mode, attention, runner, steps,
                         check_saturation=check_saturation)


_WARNED_UNVALIDATED: set[str] = set()


def warn_unvalidated(plan: ExecutionPlan) -> bool:
    """One warning per bundle and process when ``plan`` runs quantized HTP graphs that no simulator run judged at
    export (the manifest's ``htp_check`` says unvalidated, ``kztts.export.htp.export_check``); True when it
    warned."""
    m = plan.bundle.manifest
    if not m.htp_unvalidated:
        return False
    quantized = sorted({f"{role} {m.graphs[g].precision}" for role, s in plan.steps.items() if s.device == "htp"
                        for g in s.graphs if g in m.graphs
                        and (e := G.HTP_PRECISION_ENTRIES.get(m.graphs[g].precision)) is not None and e.quantized})
    key = str(Path(m.path).resolve())
    if not quantized or key in _WARNED_UNVALIDATED:
        return False
    _WARNED_UNVALIDATED.add(key)
    log.warning("%s: its quantized HTP graphs (%s) are unvalidated: %s; check them with `kztts validate --target` "
                "before trusting what it makes", Path(m.path).parent, ", ".join(quantized),
                m.htp_check.get("reason", "not checked at export"))
    return True
