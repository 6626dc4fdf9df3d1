"""An execution plan as decided (``kztts.plan.resolve``): per role, its graphs, device, precision,
threads and why; it opens each session once (in this process, or an HTP host process) and builds the
runners from them, so no runner ever chooses a device."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kztts.bundle import graphs as G
from kztts.bundle.segments import DEFAULT_THRESHOLD, segment_graph_name
from kztts.core.errors import BundleError, KzttsError
from kztts.htp.hosts import HtpHosts
from kztts.htp.placement import LayerPlacement
from kztts.htp.qnn import open_target_session, qnn_available
from kztts.htp.saturation import SaturationGuard
from kztts.htp.targets import Target
from kztts.runners.batched import BatchedCodePredictor, BatchedTalker
from kztts.runners.code_predictor import CodePredictor
from kztts.runners.codec import Decoder, Encoder, StaticChunkDecoder, StreamingDecoder, decoder_kwargs
from kztts.runners.hybrid import DEFAULT_CHUNK, HybridTalker
from kztts.runners.hybrid_static import HybridHandover, HybridStaticTalker
from kztts.runners.protocol import TalkerRunner
from kztts.runners.speaker import SpeakerEncoder
from kztts.runners.talker import DEFAULT_CONTEXT, Talker
from kztts.runners.talker_handover import HandoverTalker
from kztts.runners.talker_prefill_only import PrefillOnlyTalker
from kztts.runners.talker_segmented import SegmentedTalker
from kztts.runners.talker_static import DECODE, PREFILL, StaticTalker

log = logging.getLogger(__name__)

ROLES = ("talker_prefill", "talker_decode", "code_predictor", "decoder", "speaker_encoder", "speech_encoder")


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
    target: Target | None
    placement: LayerPlacement | None
    strict: bool
    cp_mode: str
    attention: str
    runner: str  # Talker runner: "cpu", "static", "handover", "segments"; a hybrid LM's "hybrid-cpu",
    # "hybrid-static" or "hybrid-handover"
    steps: dict[str, Step]
    check_saturation: bool = False  # a SegmentedTalker checks its HTP graphs' probes (kztts.htp.saturation)
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
                sess = open_target_session(self.bundle, graph, self.target, self.strict)
            else:
                sess = self.bundle.session(graph)
            self._sessions[key] = sess
        return sess

    @cached_property
    def hosts(self):
        """HTP host processes (``kztts.htp.hosts``) when the target caps the graph bytes per process
        and the QNN EP is present; None: HTP graphs open in this process."""
        budget = getattr(self.target, "process_context_mb", None)
        if not budget:
            return None

        if not qnn_available():  # every "HTP" graph runs on the CPU EP here: no per-process cap to honour
            return None

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
    def open_talker(self, context: int | None = None) -> TalkerRunner:
        """The Talker runner of the plan."""
        m = self.bundle.manifest
        cpu_context = min(context or DEFAULT_CONTEXT, int(m.talker["max_positions"]))
        if self.runner.startswith("hybrid"):
            return self._open_hybrid(cpu_context)
        if self.runner == "cpu":
            return Talker(self.session(self.steps["talker_decode"].graphs[0]), m.talker, context=cpu_context)
        if self.runner == "segments":
            sessions = {}
            for ph in ("prefill", "decode"):
                for seg in self.placement.segments(ph):
                    for u in seg.units:  # a unit at a quantized precision runs its QDQ layer graph
                        sessions[segment_graph_name(ph, u)] = self.session(self.placement.unit_graph(ph, u),
                                                                           seg.device)
            first = segment_graph_name("prefill", 0)
            guard = None
            if self.check_saturation and "htp" in self.placement.devices:
                guard = SaturationGuard(float(self.placement.info.get("threshold", DEFAULT_THRESHOLD)), self.strict)
            return SegmentedTalker(sessions, self.placement, m.talker,
                                   float(m.graphs[first].extra.get("mask_value", -50.0)), guard)

        # the handover's HTP side needs the decode graph too: a prompt tail past C - S runs through it
        mask_value = float(m.graphs[PREFILL].extra.get("mask_value", -50.0))
        kv_scales = m.graphs[PREFILL].extra.get("kv_scales")
        # the whole-stack graphs' probes are checked as the layer graphs' are (graphs without them: no guard)
        guard = SaturationGuard(DEFAULT_THRESHOLD, self.strict) if self.check_saturation else None
        only = DECODE not in m.graphs or (self.target is not None and self.target.talker_graphs == "prefill-only")
        if not only:
            static = StaticTalker(self.session(PREFILL, "htp"), self.session(DECODE, "htp"), m.talker, mask_value,
                                  kv_scales=kv_scales, guard=guard)
        else:  # decode steps (and a prompt tail past C - S) as padded prefill chunks
            static = PrefillOnlyTalker(self.session(PREFILL, "htp"), m.talker, mask_value, kv_scales=kv_scales,
                                       guard=guard)
        if guard is not None and not static.probed:
            log.warning("%s: the static Talker graphs carry no magnitude probes (exported before them): fp16 "
                        "saturation on the HTP goes unreported; re-export the bundle with --target", m.path)
        if self.runner == "static":
            return static
        cpu = Talker(self.session(self.steps["talker_decode"].graphs[0], "cpu"), m.talker,
                     context=static.context)
        return HandoverTalker(static, cpu)

    def _open_hybrid(self, cpu_context: int) -> TalkerRunner:
        """A hybrid LM's runner: the CPU graphs, the static HTP graphs, or the HTP prefill handed to the CPU."""
        m = self.bundle.manifest
        (pre_cpu, dec_cpu), (pre_htp, dec_htp) = G.HYBRID_CPU_GRAPHS, G.HYBRID_STATIC_GRAPHS

        def cpu(context: int) -> HybridTalker:
            chunk = int(m.graphs[pre_cpu].extra.get("chunk", DEFAULT_CHUNK)) if pre_cpu in m.graphs else DEFAULT_CHUNK
            return HybridTalker(self.session(pre_cpu, "cpu"), self.session(dec_cpu, "cpu"), m.talker, context, chunk)

        if self.runner == "hybrid-cpu":
            return cpu(cpu_context)
        guard = None
        if self.check_saturation:  # the static graphs' probes cover every layer, DeltaNet states included
            threshold = float(self.placement.info.get("threshold", DEFAULT_THRESHOLD)) if self.placement \
                else DEFAULT_THRESHOLD
            guard = SaturationGuard(threshold, self.strict)
        decode = self.session(dec_htp, "htp") if self.runner == "hybrid-static" else None
        static = HybridStaticTalker(self.session(pre_htp, "htp"), decode, m.talker,
                                    float(m.graphs[pre_htp].extra.get("mask_value", -50.0)), guard=guard)
        if self.runner == "hybrid-static":
            return static
        return HybridHandover(static, cpu(static.context))

    def open_code_predictor(self, embeddings):
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
        name = self.decoder_graph()
        cls = StaticChunkDecoder if name == "decoder_chunk" else cpu_class
        return cls(self.session(name), **decoder_kwargs(self.bundle, name, {}))

    def open_decoder(self):
        """The whole-utterance decoder, on the graph the stream uses (one copy of the weights)."""
        return self._decoder(Decoder)

    def open_streaming_decoder(self):
        if self.decoder_graph() == "decoder":
            raise BundleError(f"{self.bundle.manifest.path}: streaming needs graph 'decoder_stream', which this "
                              f"bundle lacks; re-export it with `{G.GRAPHS['decoder_stream'].exported_by}`")
        return self._decoder(StreamingDecoder)

    def open_speaker_encoder(self):
        name = self.steps["speaker_encoder"].graphs[0]
        G.require(self.bundle.manifest, name, feature="a voice from a recording")
        return SpeakerEncoder.from_bundle(self.bundle, self.session(name))

    def open_speech_encoder(self):
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
                         "(target process_context_mb; kztts.htp.hosts)")
        return "\n".join(lines)
