"""kztts.export.htp.calibration: where a QDQ graph's calibration feeds come from. ``recording_talker`` drives the
float graphs of the bundle being written as the runtime does (the whole-stack static graphs, the prefill graph
alone for a prefill-only target, the dynamic Talker for ``cp_frame``) and records a copy of every feed of the graph
being quantized; ``RecordingSession`` does it for a layer graph (the quantized graphs' accuracy: tests/htp/test_qnn.py,
tests/lm/test_lm.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kztts.bundle.manifest import read_manifest
from kztts.export.htp.calibration import RecordingSession, calibration_session_options, recording_talker
from kztts.htp.targets import load_target
from kztts.runners.talker import Talker


@pytest.fixture(scope="module")
def manifest(htp_bundle):
    return read_manifest(htp_bundle)


def embeds(manifest, n: int) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((n, int(manifest.talker["hidden"]))) * 0.5).astype(np.float32)


def static_files(manifest) -> dict:
    return {name: manifest.graphs[name].file for name in ("talker_prefill", "talker_decode")}


@pytest.mark.parametrize("graph", ["talker_prefill", "talker_decode"])
def test_the_static_talker_records_the_graph_being_quantized(htp_bundle, manifest, small_target, graph):
    talker, pending = recording_talker(htp_bundle, static_files(manifest), graph, manifest.talker,
                                       load_target(small_target))
    x = embeds(manifest, 20)
    talker.prefill(x)  # two prefill chunks of 16
    for e in x[:3]:
        talker.decode(e)
    assert len(pending) == (2 if graph == "talker_prefill" else 3)
    assert all(set(f) == {t.name for t in manifest.graphs[graph].inputs} for f in pending)
    first = {k: v.copy() for k, v in pending[0].items()}
    talker.decode(x[4])
    assert all(np.array_equal(first[k], pending[0][k]) for k in first)  # copies, not the runner's buffers


def test_a_prefill_only_target_records_the_prefill_graph_while_it_decodes(htp_bundle, manifest, small_target,
                                                                         tmp_path):
    data = json.loads(small_target.read_text())
    data["talker_graphs"] = "prefill-only"
    (tmp_path / "t.json").write_text(json.dumps(data))
    talker, pending = recording_talker(htp_bundle, static_files(manifest), "talker_prefill", manifest.talker,
                                       load_target(tmp_path / "t.json"))
    x = embeds(manifest, 20)
    talker.prefill(x)
    for e in x[:3]:
        talker.decode(e)  # a decode step runs the padded prefill graph over a filled cache: recorded too
    assert len(pending) == 2 + 3


def test_cp_frame_is_calibrated_while_the_dynamic_talker_speaks(htp_bundle, manifest, small_target):
    talker, pending = recording_talker(htp_bundle, {}, "cp_frame", manifest.talker, load_target(small_target))
    assert isinstance(talker, Talker)
    talker.prefill(embeds(manifest, 5))
    assert pending == []  # the Code Predictor's own runs are recorded by its caller


def test_a_whole_stack_graph_needs_both_static_graphs(htp_bundle, manifest, small_target):
    with pytest.raises(RuntimeError, match="place talker_prefill and talker_decode on the HTP"):
        recording_talker(htp_bundle, {"talker_decode": manifest.graphs["talker_decode"].file}, "talker_decode",
                         manifest.talker, load_target(small_target))


def test_a_recording_session_copies_every_feed_and_runs_it():
    class Session:
        def run(self, outputs, feed):
            return [feed["x"] * 2]

        def get_inputs(self):
            return ["x"]

    sink: list = []
    recording = RecordingSession(Session(), sink)
    x = np.ones(3, np.float32)
    assert np.array_equal(recording.run(None, {"x": x})[0], x * 2) and recording.get_inputs() == ["x"]
    x[0] = 5.0
    assert len(sink) == 1 and sink[0]["x"].tolist() == [1.0, 1.0, 1.0]
    options = calibration_session_options()
    assert options.get_session_config_entry("session.disable_prepacking") == "1"
