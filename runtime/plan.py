"""The execution plan: for every graph a job runs, its device, precision, threads and why.

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
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from kztts import graphs as G
from kztts import env
from kztts.errors import BundleError, KzttsError
from kztts.manifest import KIND_LM
from kztts.placement import (BUILTIN_MODES, MODES, LayerPlacement, PlacementError, builtin, parse_phases,
                             parse_placement)
from kztts.segments import segment_graph_name
from kztts.targets import TargetError, parse_target, target_path

log = logging.getLogger(__name__)

ATTENTION_ENV = "KZTTS_ATTENTION"  # "plain" keeps the plain CPU graphs (A/B measurements)
ROLES = ("talker_prefill", "talker_decode", "code_predictor", "decoder", "speaker_encoder", "speech_encoder")


def attention_from_env() -> str:
    """``$KZTTS_ATTENTION`` (default ``fused``), checked."""
    return env.choice(ATTENTION_ENV, G.ATTENTIONS, "fused")


@dataclass(frozen=True)
class Step:
    """One role of the job: the graphs that serve it, where they run and why."""

    role: str
    graphs: tuple[str, ...]
    device: str
    precision: str
    threads: int
    reason: str

    def to_json(self) -> dict:
        return {"role": self.role, "graphs": list(self.graphs), "device": self.device,
                "precision": self.precision, "threads": self.threads, "reason": self.reason}


@dataclass
class ExecutionPlan:
    """Where each role runs; opens (and keeps) the sessions and builds the runners."""

    bundle: Any
    target: Any  # kztts.targets.Target | None
    placement: LayerPlacement | None
    strict: bool
    cp_mode: str
    attention: str
    runner: str  # Talker runner: "cpu", "static", "handover" or "segments"
    steps: dict[str, Step]
    check_saturation: bool = False  # a SegmentedTalker checks its HTP graphs' probes (kztts.saturation)
    _sessions: dict = field(default_factory=dict, repr=False)  # (graph, device) -> session

    # ------------------------------------------------------------ sessions
    def device_of(self, graph: str) -> str:
        for s in self.steps.values():
            if graph in s.graphs:
                return s.device
        return "cpu"

    def session(self, graph: str, device: str | None = None):
        """The session of ``graph`` on its planned device (opened once). A bundle whose graph lacks an
        input the runtime feeds (an older export) is refused first, naming the re-export command."""
        key = (graph, device or self.device_of(graph))
        sess = self._sessions.get(key)  # runners ask per run: the checks below happen once
        if sess is None:
            if graph in G.GRAPHS:
                role = next((s.role for s in self.steps.values() if graph in s.graphs), G.GRAPHS[graph].role)
                G.require(self.bundle.manifest, graph, feature=f"the {role.replace('_', ' ')}",
                          inputs=G.GRAPHS[graph].inputs)
            if key[1] == "htp" and self.hosts is not None:
                sess = self.hosts.open(graph)
            elif key[1] == "htp":
                from kztts.qnn import open_target_session

                sess = open_target_session(self.bundle, graph, self.target, self.strict)
            else:
                sess = self.bundle.session(graph)
            self._sessions[key] = sess
        return sess

    @cached_property
    def hosts(self):
        """HTP host processes (``kztts.htp_hosts``) when the target caps the graph bytes per process
        and the QNN EP is present; None: HTP graphs open in this process."""
        budget = getattr(self.target, "process_context_mb", None)
        if not budget:
            return None
        from kztts.qnn import qnn_available

        if not qnn_available():  # every "HTP" graph runs on the CPU EP here: no per-process cap to honour
            return None
        from kztts.htp_hosts import HtpHosts

        return HtpHosts(self.bundle, self.target, self.strict, budget)

    def host_summary(self) -> list[dict]:
        """The HTP host processes opened so far (``HtpHosts.summary``); [] when none."""
        hosts = self.__dict__.get("hosts")
        return hosts.summary() if hosts is not None else []

    def close(self) -> None:
        """End the HTP host processes (sessions of this process close with the plan)."""
        hosts = self.__dict__.get("hosts")
        if hosts is not None:
            hosts.close()

    # ------------------------------------------------------------ runners
    def open_talker(self, context: int | None = None):
        """The Talker runner of the plan (``kztts.talker.Talker`` API)."""
        from kztts.talker import DEFAULT_CONTEXT, Talker

        m = self.bundle.manifest
        cpu_context = min(context or DEFAULT_CONTEXT, int(m.talker["max_positions"]))
        if self.runner == "cpu":
            return Talker(self.session(self.steps["talker_decode"].graphs[0]), m.talker, context=cpu_context)
        if self.runner == "segments":
            from kztts.talker_segmented import SegmentedTalker

            sessions = {}
            for ph in ("prefill", "decode"):
                for seg in self.placement.segments(ph):
                    for u in seg.units:
                        name = segment_graph_name(ph, u)
                        sessions[name] = self.session(name, seg.device)
            first = segment_graph_name("prefill", 0)
            guard = None
            if self.check_saturation and "htp" in self.placement.devices:
                from kztts.saturation import SaturationGuard
                from kztts.segments import DEFAULT_THRESHOLD

                guard = SaturationGuard(float(self.placement.info.get("threshold", DEFAULT_THRESHOLD)), self.strict)
            return SegmentedTalker(sessions, self.placement, m.talker,
                                   float(m.graphs[first].extra.get("mask_value", -50.0)), guard)
        from kztts.talker_static import DECODE, PREFILL, StaticTalker

        # the handover's HTP side needs the decode graph too: a prompt tail past C - S runs through it
        mask_value = float(m.graphs[PREFILL].extra.get("mask_value", -50.0))
        kv_scales = m.graphs[PREFILL].extra.get("kv_scales")
        only = DECODE not in m.graphs or (self.target is not None and self.target.talker_graphs == "prefill-only")
        if not only:
            static = StaticTalker(self.session(PREFILL, "htp"), self.session(DECODE, "htp"), m.talker, mask_value,
                                  kv_scales=kv_scales)
        else:  # decode steps (and a prompt tail past C - S) as padded prefill chunks
            from kztts.talker_prefill_only import PrefillOnlyTalker

            static = PrefillOnlyTalker(self.session(PREFILL, "htp"), m.talker, mask_value, kv_scales=kv_scales)
        if self.runner == "static":
            return static
        from kztts.talker_handover import HandoverTalker

        cpu = Talker(self.session(self.steps["talker_decode"].graphs[0], "cpu"), m.talker,
                     context=static.context)
        return HandoverTalker(static, cpu)

    def open_code_predictor(self, embeddings):
        from kztts.code_predictor import CodePredictor

        m = self.bundle.manifest
        step = self.steps["code_predictor"]
        graph = step.graphs[0]
        mode = "step" if graph == "cp_step" else "frame"
        return CodePredictor(lambda name: self.session(name), m.code_predictor, m.talker, embeddings, mode,
                             frame_graph=graph if mode == "frame" else "cp_frame")

    def open_batched(self, embeddings, rows: int, capacity: int):
        """(``BatchedTalker``, ``BatchedCodePredictor``) over ``talker_batched`` / ``cp_frame_batched``:
        continuous batching runs where the plan runs the fused CPU graphs (their batch-1 forms), so
        each row gets what its stream would get alone."""
        from kztts.batch_runners import BatchedCodePredictor, BatchedTalker

        used = (self.steps["talker_decode"].graphs[0], self.steps["code_predictor"].graphs[0])
        if self.runner != "cpu" or used != ("talker_gqa", "cp_frame_gqa"):
            raise KzttsError(f"batched synthesis runs the fused CPU graphs, but this plan runs {used[0]} and "
                             f"{used[1]} (runner {self.runner}); run it without a target or placement, with "
                             "fused attention and the frame Code Predictor")
        m = self.bundle.manifest
        return (BatchedTalker(self.session("talker_batched"), m.talker, rows, capacity),
                BatchedCodePredictor(self.session("cp_frame_batched"), embeddings,
                                     int(m.code_predictor["num_code_groups"]) - 1))

    def decoder_graph(self) -> str:
        return self.steps["decoder"].graphs[0]

    def _decoder(self, cpu_class):
        """``cpu_class`` (Decoder / StreamingDecoder) on the planned decoder graph; the static
        ``decoder_chunk`` gets the ``StaticChunkDecoder``, which serves both APIs."""
        from kztts.codec import StaticChunkDecoder, decoder_kwargs

        name = self.decoder_graph()
        cls = StaticChunkDecoder if name == "decoder_chunk" else cpu_class
        return cls(self.session(name), **decoder_kwargs(self.bundle, name, {}))

    def open_decoder(self):
        """The whole-utterance decoder, on the graph the stream uses (one copy of the weights)."""
        from kztts.codec import Decoder

        return self._decoder(Decoder)

    def open_streaming_decoder(self):
        from kztts.codec import StreamingDecoder

        if self.decoder_graph() == "decoder":
            raise BundleError(f"{self.bundle.manifest.path}: streaming needs graph 'decoder_stream', which this "
                              f"bundle lacks; re-export it with `{G.GRAPHS['decoder_stream'].exported_by}`")
        return self._decoder(StreamingDecoder)

    def open_speaker_encoder(self):
        from kztts.speaker import SpeakerEncoder

        name = self.steps["speaker_encoder"].graphs[0]
        G.require(self.bundle.manifest, name, feature="a voice from a recording")
        return SpeakerEncoder.from_bundle(self.bundle, self.session(name))

    def open_speech_encoder(self):
        from kztts.codec import Encoder

        G.require(self.bundle.manifest, "encoder", feature="an ICL voice (--ref-audio)")
        return Encoder.from_bundle(self.bundle, self.session("encoder"))

    # ------------------------------------------------------------ reporting
    def graphs(self, roles: tuple[str, ...] = ROLES) -> list[str]:
        """The graphs the given roles run, in plan order, each once."""
        out: list[str] = []
        for r in (r for r in roles if r in self.steps):
            for g in self.steps[r].graphs:
                if g not in out:
                    out.append(g)
        return out

    def to_json(self) -> dict:
        return {"target": self.target.name if self.target else None, "strict": self.strict,
                "placement": self.placement.describe() if self.placement else None, "runner": self.runner,
                "steps": [s.to_json() for s in self.steps.values()]}

    def table(self) -> str:
        """The plan as a text table (``kztts synth --explain``, ``kztts inspect --plan``)."""
        head = (f"execution plan: target {self.target.name if self.target else 'none (CPU only)'}"
                f"{', strict' if self.strict else ''}; Talker runner {self.runner}"
                + (f"; placement {self.placement.describe()}" if self.placement else ""))
        rows = [("role", "graphs", "device", "precision", "threads", "why")]
        for s in self.steps.values():
            graphs = ", ".join(s.graphs) if len(s.graphs) <= 3 else f"{s.graphs[0]} .. {s.graphs[-1]} ({len(s.graphs)})"
            rows.append((s.role, graphs, s.device, s.precision, str(s.threads) if s.threads else "auto", s.reason))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5] for r in rows]
        budget = getattr(self.target, "process_context_mb", None)
        if budget and any(s.device == "htp" for s in self.steps.values()):
            lines.append(f"HTP graphs open in host processes of at most {budget:g} MB of graph files each "
                         "(target process_context_mb; kztts.htp_hosts)")
        return "\n".join(lines)


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
    if isinstance(data, dict) and data.get("schema") == "kztts-qnn-target/1":
        target = parse_target(data, path)
        if target.layer_placement is None:
            raise PlacementError(f"{path}: the target has no 'layer_placement' (per-layer devices); add one, "
                                 "or give a placement mode or file")
        prefill, decode = parse_phases(target.layer_placement, str(path), num_layers, "layer_placement.")
        return LayerPlacement("explicit", prefill, decode, str(path))
    return parse_placement(data, str(path), num_layers)


class _Resolver:
    def __init__(self, bundle, target, placement, strict: bool, cp_mode: str, attention: str, segments: bool):
        self.bundle, self.m = bundle, bundle.manifest
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
            return "fp16 (htp)" if p in ("fp32", "fp16") else f"{p} (htp)"
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
        strict mode raises (``kztts.qnn_package``). Asked once a target is known."""
        from kztts.qnn_package import check_target_skel

        return check_target_skel(self.target, self.strict)

    def cpu_graph(self, plain: str, fused: str) -> tuple[str, str]:
        if self.attention == "fused" and self.has(fused):
            return fused, f"CPU, fused attention ({fused} in the bundle)"
        if self.attention == "fused":
            return plain, f"CPU, plain attention (no {fused} in the bundle)"
        return plain, f"CPU, plain attention ({ATTENTION_ENV}=plain)"

    # ------------------------------------------------------------ roles
    def talker(self) -> tuple[str, Step, Step]:
        cpu_graph, cpu_why = self.cpu_graph("talker", "talker_gqa")
        if self.placement is not None:
            pl = self.placement
            why = f"placement {pl.source or pl.mode}"
            if pl.uniform() != "cpu":
                self._need_target(why)
                if self.htp_refusal:
                    why = f"{why}, fallback: {self.htp_refusal}"
                    pl = self.placement = builtin("all-cpu", pl.num_layers)
            pre, dec = pl.uniform("prefill"), pl.uniform("decode")
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
                names = [segment_graph_name(ph, u) for s in segs for u in s.units]
                devs = sorted({s.device for s in segs})
                desc = "; ".join(f"{s.label} on {s.device}" for s in segs)
                steps.append(Step(f"talker_{ph}", tuple(names), "+".join(devs),
                                  "fp32 (cpu) / fp16 (htp)" if len(devs) > 1 else self.precision(names[0], devs[0]),
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
            # without the prefill graph there is nothing to hand over: the whole Talker on the CPU
            return "cpu", p, self.step("talker_decode", [cpu_graph], "cpu", p.reason)
        if d.device == "htp":
            return "static", p, d
        G.require(self.m, self.decode_graph(), feature="the HTP prefill's prompt tail (handover to CPU decode)")
        return "handover", p, d

    def decode_graph(self) -> str:
        """The static graph of HTP decode steps: ``talker_prefill`` itself (``kztts.talker_prefill_only``)
        when the target says ``talker_graphs: prefill-only`` or the bundle has no decode graph."""
        only = self.target is not None and self.target.talker_graphs == "prefill-only"
        if self.has("talker_prefill") and (only or not self.has("talker_decode")):
            return "talker_prefill"
        return "talker_decode"

    def _need_target(self, why: str) -> None:
        """HTP work without a target runs on the target the bundle's static graphs were made for."""
        if self.target is None:
            from kztts.qnn import bundle_target
            from kztts.targets import load_target

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


def resolve_plan(bundle, *, target=None, placement: "str | LayerPlacement | None" = None, strict: bool = False,
                 cp_mode: str = "frame", attention: str | None = None, segments: bool = False,
                 check_saturation: bool = False) -> ExecutionPlan:
    """Decide where every role of a synthesis runs (module docstring); nothing is opened yet.
    ``segments``: run the Talker as its per-layer graphs even when the placement is uniform
    (calibration and per-segment validation read every layer's outputs). ``check_saturation``
    (synthesis): a placement with Talker work on the HTP runs the per-layer graphs when the bundle
    has them, since their magnitude probes are checked on every call (``kztts.saturation``)."""
    if target is not None:
        from kztts.targets import load_target

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
    r = _Resolver(bundle, target, placement, strict, cp_mode, attention, segments)
    runner, pre, dec = r.talker()
    steps = {"talker_prefill": pre, "talker_decode": dec}
    if bundle.manifest.kind != KIND_LM:  # an LM bundle (kztts.lm) is the decoder stack alone
        steps.update(code_predictor=r.code_predictor(), decoder=r.decoder(), speaker_encoder=r.speaker_encoder(),
                     speech_encoder=r.speech_encoder())
    return ExecutionPlan(bundle, r.target, r.placement, strict, cp_mode, attention, runner, steps,
                         check_saturation=check_saturation)
