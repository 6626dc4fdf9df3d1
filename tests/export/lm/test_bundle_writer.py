"""LM bundles written from a GGUF (``kztts.export.lm.bundle_writer`` with ``kztts.export.lm.tiny_gguf``'s tiny Qwen2
GGUF) generate what the directory's bundle generates; ``--cpu-graphs fused`` writes the fused Talker alone; the
``--weights`` / ``--kv`` variants of an LM bundle stay near fp32."""
from __future__ import annotations

import json

import pytest

from support import cosine

PROMPT, STEPS = "Hello, how are you? Bonjour 你好", 32  # as tests/lm/test_lm.py


def _gguf_and_dir_bundles():
    from kztts.export.lm.bundle_writer import cached_lm_bundle
    from kztts.export.lm.tiny import cached_tiny_lm
    from kztts.export.lm.tiny_gguf import cached_tiny_gguf

    return cached_tiny_gguf(), cached_lm_bundle(cached_tiny_lm("qwen2"))


def _same_lm(a, b) -> None:
    from kztts.generation.sampling import SamplingParams
    from kztts.lm.lm import LM, Reply

    ra, rb = Reply(), Reply()
    la, lb = LM(a), LM(b)
    la.stop_ids = lb.stop_ids = frozenset()
    greedy = SamplingParams.greedy_params()  # a GGUF has no generation_config: other sampling defaults
    list(la.generate(PROMPT, STEPS, params=greedy, reply=ra))
    list(lb.generate(PROMPT, STEPS, params=greedy, reply=rb))
    assert ra.ids == rb.ids and len(ra.ids) == STEPS
    assert la.encode(PROMPT) == lb.encode(PROMPT) and la.default_system == lb.default_system
    chat = la.bundle.manifest.data["chat"]
    assert chat["template_matches"] is True


def test_gguf_export_equals_the_directory_export():
    """A GGUF of the tiny Qwen2 (F32 tensors, its tokenizer and chat template in the metadata) exports
    to a bundle that generates exactly what the directory's bundle does."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle

    gguf, dir_bundle = _gguf_and_dir_bundles()
    bundle = cached_lm_bundle(gguf)
    assert bundle.exists() and json.loads((bundle / "kztts.json").read_text())["source"]["gguf"]
    _same_lm(bundle, dir_bundle)


@pytest.mark.slow
def test_export_gguf_cli(tmp_path):
    from kztts.cli.main import main

    gguf, dir_bundle = _gguf_and_dir_bundles()
    assert main(["-q", "export", "--gguf", str(gguf), "-o", str(tmp_path / "b")]) == 0
    _same_lm(tmp_path / "b", dir_bundle)
    # a variant of a CPU-only LM bundle rewrites every graph of graphs/
    assert main(["-q", "export", "--gguf", str(gguf), "-o", str(tmp_path / "v"), "--weights", "int8"]) == 0
    from kztts.lm.lm import LM

    assert LM(tmp_path / "v").bundle.manifest.data["variant"]["weights"] == "int8"


def test_export_only_the_fused_cpu_graph(tmp_path, tiny_dir, capsys):
    """``--cpu-graphs fused`` (what CI's real-checkpoint check exports): the fused Talker alone, generating what
    the full bundle generates; a TTS checkpoint refuses the flag in one line."""
    from kztts.cli.main import main

    gguf, dir_bundle = _gguf_and_dir_bundles()
    assert main(["-q", "export", "--gguf", str(gguf), "-o", str(tmp_path / "b"), "--cpu-graphs", "fused"]) == 0
    graphs = json.loads((tmp_path / "b" / "kztts.json").read_text())["graphs"]
    assert set(graphs) == {"talker_gqa"}
    assert sorted(p.name for p in (tmp_path / "b" / "graphs").glob("*.onnx")) == ["talker_gqa.onnx"]
    _same_lm(tmp_path / "b", dir_bundle)
    capsys.readouterr()
    assert main(["export", str(tiny_dir), "-o", str(tmp_path / "t"), "--cpu-graphs", "fused"]) == 2
    assert "--cpu-graphs applies to LM exports" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("weights, kv", [("int8", "fp16"), ("int4", "fp32")])
def test_precision_variants_of_an_lm_bundle(qwen3_bundle, weights, kv):
    """``--weights`` / ``--kv`` variants (kztts.export.common.variants) of an LM bundle run and stay near fp32
    (measured on the tiny Qwen3, last-position logits: int8 + kv fp16 0.9994, int4 0.926; random weights)."""
    from kztts.export.common.variants import cached_variant
    from kztts.lm.lm import LM

    base, var = LM(qwen3_bundle), LM(cached_variant(qwen3_bundle, weights=weights, kv=kv))
    assert var.bundle.manifest.data["variant"]["weights"] == weights
    ids = base.encode(PROMPT)
    base._claim(object())
    var._claim(object())
    cos = cosine(base.feed(ids), var.feed(ids))
    assert cos > (0.999 if weights == "int8" else 0.9), cos
