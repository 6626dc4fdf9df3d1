"""Fixtures of the HTP tests: the QNN skip and the massive-activation model on the small simulator target."""
from __future__ import annotations

import json

import pytest

from support import MASSIVE_LAYER


@pytest.fixture(scope="module")
def qnn():
    """Skips (reason printed with -ra) when onnxruntime-qnn is missing; listed first so the skip
    comes before any bundle is built."""
    return pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")


@pytest.fixture(scope="module")
def massive_model():
    """The tiny "proj" checkpoint with a ~1e5 activation injected into Talker layer ``MASSIVE_LAYER``
    (``make-tiny --massive-layer``, ``kztts.export.tts.massive``): fp16 cannot hold it, fp32 can."""
    from kztts.export.tts.tiny import cached_tiny

    return cached_tiny("proj", massive_layer=MASSIVE_LAYER)


@pytest.fixture(scope="module")
def massive_bundle(massive_model, small_target):
    """CPU graphs + static HTP graphs + per-layer segments (export needs no QNN)."""
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(massive_model, small_target, segments=True)


@pytest.fixture(scope="module")
def talker_only_target(small_target, tmp_path_factory):
    """The small simulator target with the Code Predictor and the decoder on the CPU: the Talker
    placement alone is on the HTP (the HTP Code Predictor's and decoder's checks are in test_qnn
    and tests/plan/test_resolve.py)."""
    data = json.loads(small_target.read_text())
    data["placement"].update(cp_frame="cpu", decoder="cpu")
    p = tmp_path_factory.mktemp("targets") / small_target.name  # same name: the bundle's graphs were made for it
    p.write_text(json.dumps(data))
    return p
