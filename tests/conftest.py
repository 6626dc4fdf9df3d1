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
def proj_bundle(tiny_dir):
    """The tiny "proj" checkpoint's CPU bundle (not parametrized)."""
    from kztts.export.tts.bundle_writer import cached_bundle

    return cached_bundle(tiny_dir)


@pytest.fixture(scope="session")
def equal_bundle():
    """The tiny "equal" checkpoint's CPU bundle (not parametrized; the demo's model, fp32 weights)."""
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny("equal"))


@pytest.fixture(scope="module")
def plain_bundle(equal_bundle):
    """``equal_bundle`` opened without loading its graphs: what plan and registry checks read."""
    from kztts.bundle.bundle import Bundle

    return Bundle.open(equal_bundle, load_graphs=False)


@pytest.fixture(scope="session")
def eos_bundle():
    """The tiny "proj" checkpoint with the EOS bias (greedy speech ends by EOS after a few frames), its CPU
    bundle (cached)."""
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny("proj", eos_bias=True))


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
def prefill_only_target(small_target, tmp_path_factory):
    """``small_target`` with one Talker graph, as the shipped simulator target: decode steps run the
    padded prefill graph (``kztts.runners.talker_prefill_only``)."""
    import json

    data = json.loads(small_target.read_text())
    data["talker_graphs"] = "prefill-only"
    p = tmp_path_factory.mktemp("targets") / "simulator_small_prefill_only.json"
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


@pytest.fixture(scope="session")
def sequences(htp_bundle):
    """Teacher-forcing inputs of ``htp_bundle``: two real text prompts + 14 decode steps each."""
    from kztts.export.validate.htp import bundle_sequences

    return bundle_sequences(htp_bundle, frames=14)


@pytest.fixture(scope="session")
def qwen3_dir():
    """The tiny random Qwen3 causal LM (a Hugging Face directory, cached)."""
    from kztts.export.lm.tiny import cached_tiny_lm

    return cached_tiny_lm("qwen3")


@pytest.fixture(scope="session")
def chat_bundle(qwen3_dir):
    """``qwen3_dir``'s CPU bundle (its fused graphs and ``talker_batched``): what ``kztts serve`` chats with."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle

    return cached_lm_bundle(qwen3_dir)


@pytest.fixture(scope="session")
def qwen3_bundle(qwen3_dir, small_target):
    """``qwen3_dir`` exported with the CPU graphs, the static HTP graphs and the layer segments of
    ``small_target`` (cached): the LM tests' bundle."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle

    return cached_lm_bundle(qwen3_dir, target=str(small_target), segments=True)


@pytest.fixture(scope="session")
def voice_wav(tmp_path_factory):
    """The synthetic reference voice (``kztts.core.audio.synthetic_voice``) as a float WAV file, so the CLI and
    qwen-tts see the same samples."""
    from kztts.core.audio import synthetic_voice, write_wav

    path = tmp_path_factory.mktemp("voice") / "voice.wav"
    write_wav(path, synthetic_voice(), 24000, subtype="FLOAT")
    return path
