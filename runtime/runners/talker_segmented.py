"""The Talker as a chain of layer segments, each on its device: a ``TalkerRunner`` (``kztts.runners.protocol``).

The bundle holds every layer (and the head) as its own static graph, in a prefill
chunk and an AR-1 decode shape (``kztts.export.graphs.segment_graphs``). A placement
(``kztts.htp.placement``) puts each on the CPU (fp32) or the HTP (fp16); this runner
passes the hidden state from graph to graph and keeps one host KV cache in the
HTP layout, which graphs on either device read and extend, so a layer can change
device between prefill and decode with no conversion.

Chunking, masks and positions are those of ``kztts.runners.talker_static.StaticTalker``.
``on_unit(phase, unit, outputs)`` sees every graph's outputs (``hidden`` rows of the
valid positions, ``stats``): ``kztts calibrate`` and ``kztts validate --placement``
use it. ``guard`` (a ``kztts.htp.saturation.SaturationGuard``) checks the ``stats`` of every graph
call on the HTP (fp16 saturation at run time).
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import onnxruntime as ort

from kztts.bundle.graphs import SEGMENT_KV
from kztts.bundle.segments import Unit, segment_graph_name
from kztts.core.errors import BundleError, KzttsError
from kztts.htp.placement import PHASES, LayerPlacement
from kztts.htp.saturation import SaturationGuard
from kztts.runners.rope import rope_tables
from kztts.runners.talker_static import ChunkedTalker, chunk_inputs

UnitHook = Callable[[str, Unit, dict], None]


def _static_dim(sess: ort.InferenceSession, name: str, axis: int) -> int:
    for a in sess.get_inputs():
        if a.name == name and isinstance(a.shape[axis], int):
            return a.shape[axis]
    raise BundleError(f"layer segment graph has no static input {name!r}; re-export with --segments")


class SegmentedTalker(ChunkedTalker):
    """``prefill(embeds[T, H])`` then ``decode(embed[H])``; both return (logits [vocab], hidden [H])."""

    def __init__(self, sessions: dict[str, ort.InferenceSession], placement: LayerPlacement, config: dict,
                 mask_value: float = -50.0, guard: SaturationGuard | None = None):
        self.placement = placement
        self.guard = guard
        self.num_layers = int(config["num_layers"])
        if placement.num_layers != self.num_layers:
            raise KzttsError(f"placement {placement.source} is for {placement.num_layers} layers, "
                             f"the Talker has {self.num_layers}")
        self.hidden_size = int(config["hidden"])
        self.vocab = int(config["vocab"])
        kv, hd = int(config["num_kv_heads"]), int(config["head_dim"])
        self.sessions = sessions
        self.plan = {ph: placement.segments(ph) for ph in PHASES}
        for ph in PHASES:
            for seg in self.plan[ph]:
                for u in seg.units:
                    if segment_graph_name(ph, u) not in sessions:
                        raise BundleError(f"no session for {segment_graph_name(ph, u)}")
        pre0 = sessions[segment_graph_name("prefill", 0)]
        dec0 = sessions[segment_graph_name("decode", 0)]
        self.chunk = _static_dim(pre0, "hidden_in", 1)
        self.graph_context = _static_dim(pre0, "attention_mask", 3)
        if _static_dim(dec0, "hidden_in", 1) != 1 or _static_dim(dec0, "attention_mask", 3) != self.graph_context:
            raise BundleError("layer segment graphs disagree on the static context; re-export the bundle")
        C = self.graph_context
        if C - 1 > int(config["max_positions"]):
            raise KzttsError(f"static talker context {C} exceeds the model's {config['max_positions']} positions")
        self.mask_value = np.float32(mask_value)
        self.keys = [np.zeros((kv, 1, hd, C - 1), np.float32) for _ in range(self.num_layers)]
        self.values = [np.zeros((kv, 1, C - 1, hd), np.float32) for _ in range(self.num_layers)]
        self._cos, self._sin = rope_tables(C + self.chunk, hd, float(config["rope_theta"]))
        self.length = 0
        self.on_unit: UnitHook | None = None
        self.seconds: dict[str, float] = {}  # "phase/device" -> wall time in that device's graphs
        self.steps: dict[str, int] = {ph: 0 for ph in PHASES}  # graph passes per phase (chunks, decode steps)

    def reset(self) -> None:
        super().reset()
        if self.guard is not None:
            self.guard.new_utterance()

    def _run_chunk(self, phase: str, embeds: np.ndarray, n: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        p, C = self.length, self.graph_context
        P = C - seq
        h, mask = chunk_inputs(embeds, n, seq, p, C, self.hidden_size, self.mask_value)
        cos, sin = self._cos[None, p:p + seq], self._sin[None, p:p + seq]
        logits = hidden = None
        self.steps[phase] += 1
        for seg in self.plan[phase]:
            started = time.perf_counter()
            for u in seg.units:
                sess = self.sessions[segment_graph_name(phase, u)]
                if u == "head":
                    logits, hidden, stats = sess.run(None, {"hidden_in": h})
                    out = {"hidden": hidden[0, :n], "logits": logits[0, :n], "stats": stats}
                else:
                    keys, values = self.keys[u], self.values[u]
                    feed = {"hidden_in": h, "attention_mask": mask, "rope_cos": cos, "rope_sin": sin,
                            SEGMENT_KV.past_name("key"): keys if P == C - 1 else np.ascontiguousarray(keys[..., :P]),
                            SEGMENT_KV.past_name("value"): values if P == C - 1 else
                            np.ascontiguousarray(values[:, :, :P])}
                    h, nk, nv, stats = sess.run(None, feed)
                    keys[..., p:p + n] = nk[..., :n]
                    values[:, :, p:p + n] = nv[:, :, :n]
                    out = {"hidden": h[0, :n], "stats": stats}
                if self.guard is not None and seg.device == "htp":
                    self.guard.check(phase, u, stats)
                if self.on_unit is not None:
                    self.on_unit(phase, u, out)
            key = f"{phase}/{seg.device}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - started
        self.length = p + n
        return logits[0, n - 1], hidden[0, n - 1]
