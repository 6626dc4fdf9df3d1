"""Names shared by the layer-segment graphs and the static graphs' probes (export) and their runners (runtime)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

Unit = Union[int, str]  # a layer index, or "head" (final norm + codec head)

# What each ``stats`` output holds: the largest |x| of these tensors inside the graph.
LAYER_STATS = ("residual_in", "attn_norm_out", "qkv_proj", "attn_scores", "attn_out", "residual_mid",
               "mlp_norm_out", "mlp_intermediate", "mlp_out", "residual_out")
HEAD_STATS = ("residual_in", "logits")
# The whole-stack static graphs' probes: every layer's LAYER_STATS [L, len(LAYER_STATS)], then the
# head's HEAD_STATS (outputs of these names; bundles exported before them have none)
STATIC_STATS = ("layer_stats", "head_stats")

# The precision guard's threshold, one definition for calibration (which layers go to the CPU)
# and for the run-time check of the HTP segments' probes (kztts.htp.saturation): three bits of
# headroom below fp16's largest value (the reasons are in kztts.eval.calibrate's docstring).
FP16_MAX = 65504.0
DEFAULT_THRESHOLD = FP16_MAX / 8


def segment_graph_name(phase: str, unit: Unit, precision: str | None = None) -> str:
    """``talker_prefill_layer_3``, ``talker_decode_head``, ...; with a quantized ``precision`` the unit's QDQ
    variant (``talker_prefill_layer_3_w4a16``, exported with ``--segments --placement``)."""
    name = f"talker_{phase}_head" if unit == "head" else f"talker_{phase}_layer_{int(unit)}"
    return f"{name}_{precision}" if precision else name


@dataclass(frozen=True)
class Segment:
    """Consecutive Talker units of one phase on one device: layers ``start..stop-1`` (+ the head)."""

    phase: str
    device: str
    start: int
    stop: int
    head: bool

    @property
    def units(self) -> list[Unit]:
        return [*range(self.start, self.stop), *(["head"] if self.head else [])]

    @property
    def label(self) -> str:
        layers = "" if self.stop == self.start else (
            f"layer {self.start}" if self.stop - self.start == 1 else f"layers {self.start}-{self.stop - 1}")
        return " + ".join(p for p in (layers, "head" if self.head else "") if p)
