"""Where a QDQ graph's calibration data come from: a :class:`CalibrationSource` yields the graph's own input feeds
while the float graphs of the bundle being written run its data, and :func:`kztts.export.htp.qdq.quantize_graphs`
ranges the graph's tensors over them. Two sources: the TTS prompts, spoken by the model
(``kztts.export.tts.prompt_calibration.TtsPrompts``), and the LM texts, prefilled and teacher-forced
(``kztts.export.lm.text_calibration.LmTexts``). The exporter passes its source to
``kztts.export.htp.static_graphs.export_htp_graphs``; the QDQ route is the same for both.

Both drive the float graphs through :func:`recording_talker`: a Talker runner as the runtime would run them, on the
CPU EP, that records the feeds of the graph being calibrated. Each calibration pass drives a fresh runner and
yields the feeds one by one, so no KV-cache snapshot is kept in memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol

import numpy as np

from kztts.bundle.segments import segment_graph_name
from kztts.export.common.qdq_ranges import calibration_session_options
from kztts.htp.placement import builtin
from kztts.htp.targets import Target
from kztts.runners.codec import StaticChunkDecoder
from kztts.runners.protocol import TalkerRunner
from kztts.runners.talker import Talker
from kztts.runners.talker_prefill_only import PrefillOnlyTalker
from kztts.runners.talker_segmented import SegmentedTalker
from kztts.runners.talker_static import DECODE, PREFILL, StaticTalker

CP_FRAME = "cp_frame"  # the Code Predictor's frame graph: calibrated while the dynamic CPU Talker speaks
# the speech decoder's static graph: calibrated on the frames the dynamic CPU Talker and the Code Predictor speak
DECODER_CHUNK = "decoder_chunk"
SPOKEN_GRAPHS = (CP_FRAME, DECODER_CHUNK)  # calibrated while the dynamic CPU Talker speaks


class CalibrationSource(Protocol):
    """The calibration data of the QDQ graphs of one export."""

    what: str  # names the data in the error raised when a graph got no feed ("the calibration prompts")
    # whether ``feeds`` reads the torch model; if not, its weights are released once the float graphs are written
    reads_torch_model: bool

    def feeds(self, work_dir: Path, drive: dict[str, str], graph: str, target: Target) -> Iterator[dict]:
        """A fresh generator of ``graph``'s input feeds while the float graphs ``drive`` ({graph name: file
        relative to ``work_dir``}, the bundle being written) of ``target`` run this source's data."""
        ...


class RecordingSession:
    """An ONNX Runtime session that appends a copy of every feed it runs to ``sink`` (a layer graph's
    calibration data while the float layer graphs speak)."""

    def __init__(self, session, sink: list):
        self.session, self.sink = session, sink

    def run(self, output_names, feed, *args, **kwargs):
        self.sink.append({k: np.array(v) for k, v in feed.items()})
        return self.session.run(output_names, feed, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.session, name)


def _cpu_session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), sess_options=calibration_session_options(),
                                providers=["CPUExecutionProvider"])


def recording_talker(work_dir: Path, float_files: dict[str, str], graph: str, config: dict,
                     target: Target) -> tuple[TalkerRunner, list[dict]]:
    """A Talker runner over the float graphs in ``work_dir`` on the CPU EP (``config``: the manifest's Talker
    config; ``target``: its mask value and Talker graphs), and the list it appends ``graph``'s feeds to (copied)
    on every call: the calibration data of a QDQ quantization. The caller drains the list. ``float_files``: the
    whole-stack static graphs (``talker_prefill`` and ``talker_decode``: a :class:`StaticTalker`), or every
    layer graph and head (``kztts.bundle.segments`` names: a :class:`SegmentedTalker` with everything on the
    CPU), or neither (``graph`` is ``cp_frame`` or ``decoder_chunk``: the dynamic ``talker`` graph, nothing
    recorded by the runner).

    A target with ``talker_graphs: prefill-only``: the prefill graph is recorded as :class:`PrefillOnlyTalker`
    drives it, decode steps included. Those steps feed it a filled cache, which a prompt's first chunk never
    does: calibrated on prompts alone, the 16-bit ranges of its past-KV inputs and of the attention over them
    were too narrow for decoding (a narrow-head model's logits fell to cosine 0.75 against fp32 from the first
    decode step on)."""
    pending: list[dict] = []
    mask_value = target.attention_mask_value
    if target.talker_graphs == "prefill-only" and graph == PREFILL and PREFILL in float_files:
        talker = PrefillOnlyTalker(_cpu_session(work_dir / float_files[PREFILL]), config, mask_value)
        talker.on_feed = lambda name, feed: pending.append({k: np.array(v) for k, v in feed.items()})
        return talker, pending
    if graph in SPOKEN_GRAPHS:
        return Talker(_cpu_session(work_dir / "graphs" / "talker.onnx"), config), pending
    if segment_graph_name("prefill", 0) in float_files:
        sessions = {n: _cpu_session(work_dir / rel) for n, rel in float_files.items()}
        sessions[graph] = RecordingSession(sessions[graph], pending)
        placement = builtin("all-cpu", int(config["num_layers"]))
        return SegmentedTalker(sessions, placement, config, mask_value), pending
    if PREFILL not in float_files or DECODE not in float_files:
        raise RuntimeError("QDQ calibration drives both static Talker graphs: place talker_prefill and "
                           "talker_decode on the HTP")
    talker = StaticTalker(_cpu_session(work_dir / float_files[PREFILL]), _cpu_session(work_dir / float_files[DECODE]),
                          config, mask_value)
    talker.on_feed = lambda name, feed: pending.append({k: np.array(v) for k, v in feed.items()}) \
        if name == graph else None
    return talker, pending


def chunk_decoder_feeds(path: Path, codes: np.ndarray, codebook_size: int) -> list[dict]:
    """The feeds of the static decoder graph at ``path`` (``decoder_chunk``, on the CPU EP) while it decodes
    ``codes`` [frames, 16] from a reset as the runtime does (``kztts.runners.codec.StaticChunkDecoder``: whole runs,
    the last one padded), carried state included."""
    sink: list[dict] = []
    StaticChunkDecoder(RecordingSession(_cpu_session(path), sink), codebook_size=codebook_size).decode(codes)
    return sink
