"""kztts.export.graphs.hybrid_graphs: the hybrid LM's CPU graphs as exported. ``export_hybrid_cpu`` writes
``hybrid_prefill`` (dynamic T, the chunked rule) and ``hybrid_decode`` (one position, the recurrent rule) under the
registry's cache names, and each ONNX graph computes what its torch module computes, at lengths other than the
one it was traced at (the static graphs and the whole bundle against transformers: tests/lm/test_hybrid_lm.py)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kztts.bundle import graphs as G  # noqa: E402
from kztts.export.graphs.hybrid_graphs import HybridGraph, export_hybrid_cpu  # noqa: E402
from kztts.export.graphs.hybrid_stack import SUB_CHUNK  # noqa: E402

from support import cpu_session, plain_greedy_lm  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from kztts.export.lm.hybrid_tiny import cached_tiny_hybrid

    lm = plain_greedy_lm(cached_tiny_hybrid("qwen3_next"))
    out = tmp_path_factory.mktemp("hybrid")
    return lm, out, export_hybrid_cpu(lm, out, "test")


def test_the_cpu_graphs_and_their_names(exported):
    lm, out, specs = exported
    assert set(specs) == set(G.HYBRID_CPU_GRAPHS) and specs["hybrid_prefill"].extra["chunk"] == SUB_CHUNK
    types = list(lm.config.layer_types)
    for name, spec in specs.items():
        assert (out / spec.file).is_file() and spec.variant == "dynamic" and spec.precision == "fp32"
        assert [t.name for t in spec.inputs] == ["inputs_embeds", "rope_cos", "rope_sin",
                                                 *G.hybrid_cache_names(types, G.DYNAMIC_KV)]
        assert [t.name for t in spec.outputs] == ["logits", "hidden",
                                                  *G.hybrid_cache_names(types, G.DYNAMIC_KV, new=True)]


@pytest.mark.parametrize("name, form, t, past", [("hybrid_prefill", "chunked", 9, 4), ("hybrid_decode", "recurrent",
                                                                                       1, 6)])
def test_each_graph_computes_what_its_module_computes(exported, name, form, t, past):
    lm, out, specs = exported
    module = HybridGraph(lm, form).eval()
    inputs = module.example_inputs(t, past)  # not the traced lengths (5 positions, 3 past)
    with torch.no_grad():
        want = [x.numpy() for x in module(*inputs)]
    session = cpu_session(out / specs[name].file)
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, {n: x.numpy() for n, x in zip(names, inputs)})
    assert len(got) == len(want)
    for g, w, o in zip(got, want, session.get_outputs()):
        assert g.shape == w.shape, o.name
        assert np.abs(g - w).max() <= 1e-4 * max(1.0, float(np.abs(w).max())), o.name
