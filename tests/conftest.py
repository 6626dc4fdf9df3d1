"""Shared fixtures: tiny reference checkpoints and their bundles, built once and cached.

Models and bundles live under ``$KZTTS_CACHE`` (default ~/.cache/kztts), keyed by
the code that builds them, so a code change rebuilds them and reruns reuse them.
"""
from __future__ import annotations

import pytest

VARIANTS = ("proj", "equal")


@pytest.fixture(scope="session", params=VARIANTS)
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_model_dir(variant):
    from kztts.export.tiny import cached_tiny

    return cached_tiny(variant)


@pytest.fixture(scope="session")
def tiny_bundle_dir(tiny_model_dir):
    from kztts.export.bundle_writer import cached_bundle

    return cached_bundle(tiny_model_dir)


@pytest.fixture(scope="session")
def reference(tiny_model_dir):
    """The official qwen-tts wrapper on the tiny checkpoint (fp32, eager)."""
    from kztts.export.checkpoint import load_reference

    return load_reference(tiny_model_dir)
