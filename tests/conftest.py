"""Shared fixtures: tiny reference checkpoints and their bundles, built once and cached.

Models and bundles live under ``$KZTTS_CACHE`` (default ~/.cache/kztts), keyed by
the code that builds them, so a code change rebuilds them and reruns reuse them.
"""
from __future__ import annotations

import os

import pytest

# Tiny models run fastest on one thread, and the test machine may be shared: more
# threads only add synchronisation (2 torch threads were 6x slower under load).
os.environ.setdefault("KZTTS_THREADS", "1")


def pytest_configure(config):
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)

VARIANTS = ("proj", "equal")
SMALL_CONTEXT, SMALL_CHUNK = 64, 16  # static shapes of the test-sized simulator target


@pytest.fixture(scope="session", params=VARIANTS)
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_model_dir(variant):
    from kztts.export.tts.tiny import cached_tiny

    return cached_tiny(variant)


@pytest.fixture(scope="session")
def tiny_bundle_dir(tiny_model_dir):
    from kztts.export.tts.bundle_writer import cached_bundle

    return cached_bundle(tiny_model_dir)


@pytest.fixture(scope="session")
def reference(tiny_model_dir):
    """The official qwen-tts wrapper on the tiny checkpoint (fp32, eager)."""
    from kztts.export.common.checkpoint import load_reference

    return load_reference(tiny_model_dir)


@pytest.fixture(scope="session")
def small_target(tmp_path_factory):
    """The simulator target with test-sized static shapes (context 64, prefill chunk 16)."""
    import json

    from kztts.htp.targets import configs_dir

    data = json.loads((configs_dir() / "simulator.json").read_text())
    data["shapes"].update(prefill_chunk=SMALL_CHUNK, context=SMALL_CONTEXT, decoder_chunk=5)  # divides the decoder segments (300, 275)
    data["placement"]["decoder"] = "htp"  # the shipped targets keep it on the CPU (fp16 SNR, see htp_export)
    data["talker_graphs"] = "prefill+decode"  # simulator.json ships prefill-only; the tests check both graphs
    p = tmp_path_factory.mktemp("targets") / "simulator_small.json"
    p.write_text(json.dumps(data, indent=1))
    return p


@pytest.fixture(scope="session")
def tiny_dir():
    """The tiny "proj" checkpoint (not parametrized): the HTP tests' model."""
    from kztts.export.tts.tiny import cached_tiny

    return cached_tiny("proj")


@pytest.fixture(scope="session")
def htp_bundle(tiny_dir, small_target):
    """``tiny_dir`` exported with the static graphs of ``small_target`` (cached)."""
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(tiny_dir, small_target)
