"""kztts.generation.sampling_chain: one description of the sampling chains, followed by the host sampler and
by the in-graph sampler generated from it; one place for the sampling settings' ranges."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from kztts.core.errors import KzttsError
from kztts.export.graphs import code_predictor_graph as G
from kztts.generation import sampling as S
from kztts.generation import sampling_chain as C
from kztts.generation.sampling import ChainInputs, SamplingParams
from kztts.generation.settings import reference_settings, with_overrides

TALKER = ["repetition_penalty", "min_new_tokens", "suppress", "temperature", "top_k", "top_p", "draw"]
CODE_PREDICTOR = ["repetition_penalty", "temperature", "top_k", "top_p", "draw"]
SAMPLING = SamplingParams(0.9, 50, 0.8, 1.05)


def names(steps) -> list[str]:
    return [s.name for s in steps]


def record_calls(monkeypatch, registry: dict, calls: list[str]) -> None:
    """Wrap every implementation in ``registry`` so that calling it appends its step name to ``calls``."""
    for name, run in list(registry.items()):
        def recorded(*args, _name=name, _run=run):
            calls.append(_name)
            return _run(*args)
        monkeypatch.setitem(registry, name, recorded)


def rows(n=6, v=64, seed=0):
    """Continuous logits (no ties: eager torch.topk's tie order is unspecified) and the rest of a batch."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, v)) * 3).astype(np.float32)
    seen = rng.random((n, v)) < 0.1
    u = rng.random(n).astype(np.float32)
    return x, seen, u


def host_cp(x, seen, u, params=SAMPLING) -> list[int]:
    return [S.choose("code_predictor", xi, params, ChainInputs(u=float(ui), history=np.nonzero(si)[0]))
            for xi, si, ui in zip(x, seen, u)]


def graph_cp(x, seen, u, params=SAMPLING) -> list[int]:
    n = len(x)
    p = [torch.full((n,), float(getattr(params, f))) for f in ("temperature", "top_p", "repetition_penalty")]
    k = torch.full((n,), int(params.top_k), dtype=torch.int64)
    return G.sample_rows(torch.from_numpy(x), torch.from_numpy(seen), p[0], k, p[1], p[2],
                         torch.from_numpy(u)).tolist()


def talker_inputs(u: float) -> ChainInputs:
    return ChainInputs(u=u, history=[3, 5, 3], window=64, step=0, min_new_tokens=2, eos_id=60,
                       suppress=[i for i in range(48, 64) if i != 60])


# ---------------------------------------------------------------- the description
def test_the_chains_in_reference_order():
    assert names(C.chain("talker")) == TALKER
    assert names(C.chain("code_predictor")) == CODE_PREDICTOR
    params = {f.name for f in dataclasses.fields(SamplingParams)}
    context = {f.name for f in dataclasses.fields(ChainInputs)}
    for step in C.STEPS:
        assert set(step.params) <= params and set(step.context) <= context, step
        for p in step.params:
            assert C.setting_range(p).name == p
    assert [r.name for r in C.RANGES] == [f.name for f in dataclasses.fields(SamplingParams)][:len(C.RANGES)]


@pytest.mark.parametrize("steps", [
    (C.Step("t", C.WARPER), C.Step("rp", C.PROCESSOR), C.Step("draw", C.DRAW)),  # warper before a processor
    (C.Step("rp", C.PROCESSOR), C.Step("t", C.WARPER)),  # no draw
    (C.Step("draw", C.DRAW), C.Step("t", C.WARPER)),  # draw not last
    (C.Step("t", C.WARPER), C.Step("t", C.WARPER), C.Step("draw", C.DRAW)),  # twice
    (C.Step("x", C.WARPER, ("min_p",)), C.Step("draw", C.DRAW)),  # a setting without a range
])
def test_a_malformed_chain_is_refused(steps):
    with pytest.raises((ValueError, KeyError)):
        C.chain("talker", steps)


# ---------------------------------------------------------------- both sides follow it
def test_host_and_graph_samplers_run_the_described_steps_in_order(monkeypatch):
    host_calls, graph_calls = [], []
    record_calls(monkeypatch, S.HOST_STEPS, host_calls)
    record_calls(monkeypatch, G.GRAPH_STEPS, graph_calls)
    x, seen, u = rows(n=1)
    host = host_cp(x, seen, u)
    assert host_calls == names(C.chain("code_predictor")) == CODE_PREDICTOR
    assert graph_cp(x, seen, u) == host
    assert graph_calls == host_calls
    host_calls.clear()
    S.choose("talker", x[0], SAMPLING, talker_inputs(0.3))
    assert host_calls == names(C.chain("talker")) == TALKER


def test_greedy_runs_the_processors_then_argmax(monkeypatch):
    calls = []
    record_calls(monkeypatch, S.HOST_STEPS, calls)
    s = np.arange(64, dtype=np.float32)
    greedy = dataclasses.replace(SAMPLING, greedy=True)
    assert S.choose("talker", s, greedy, talker_inputs(0.99)) == 47  # 48.. suppressed, 60 = EOS blocked
    assert calls == ["repetition_penalty", "min_new_tokens", "suppress"]


def test_a_step_without_an_implementation_is_a_clear_error(monkeypatch):
    steps = list(C.STEPS)
    steps.insert(steps.index(next(s for s in steps if s.name == "top_p")), C.Step("min_p", C.WARPER))
    monkeypatch.setattr(C, "STEPS", tuple(steps))
    x, seen, u = rows(n=2)
    with pytest.raises(NotImplementedError, match=r"sampling step 'min_p' has no host \(kztts.generation.sampling.HOST_STEPS\)"):
        host_cp(x, seen, u)
    with pytest.raises(NotImplementedError, match=r"sampling step 'min_p' has no in-graph"):
        graph_cp(x, seen, u)


def test_a_step_without_an_implementation_fails_the_import():
    """The same check runs when kztts.generation.sampling and the export module are imported (a fresh interpreter)."""
    script = """
import kztts.generation.sampling_chain as C
C.STEPS = (C.Step("extra", C.PROCESSOR),) + C.STEPS
try:
    import kztts.generation.sampling
except NotImplementedError as e:
    print("host:", e)
C.STEPS = C.STEPS[1:]
import kztts.generation.sampling as S
C.STEPS = (C.Step("extra", C.PROCESSOR),) + C.STEPS
S.HOST_STEPS["extra"] = lambda s, p, c: s
try:
    import kztts.export.graphs.code_predictor_graph
except NotImplementedError as e:
    print("graph:", e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "host: sampling step 'extra' has no host (kztts.generation.sampling.HOST_STEPS) implementation" in out
    assert "graph: sampling step 'extra' has no in-graph (kztts.export.graphs.code_predictor_graph.GRAPH_STEPS)" in out


def test_a_new_step_is_one_entry_and_one_implementation_per_side(monkeypatch):
    """A hypothetical no-op "min_p" warper, registered here only,
    runs between top-k and top-p in the host's Talker and Code Predictor chains and in the
    generated in-graph sampler, and changes no token."""
    x, seen, u = rows(n=8, seed=3)
    before_host, before_graph = host_cp(x, seen, u), graph_cp(x, seen, u)
    steps = list(C.STEPS)
    steps.insert([s.name for s in steps].index("top_k") + 1, C.Step("min_p", C.WARPER))
    monkeypatch.setattr(C, "STEPS", tuple(steps))
    monkeypatch.setitem(S.HOST_STEPS, "min_p", lambda s, params, inputs: s)
    monkeypatch.setitem(G.GRAPH_STEPS, "min_p", lambda rows, inputs: None)
    host_calls, graph_calls = [], []
    record_calls(monkeypatch, S.HOST_STEPS, host_calls)
    record_calls(monkeypatch, G.GRAPH_STEPS, graph_calls)

    assert host_cp(x[:1], seen[:1], u[:1]) == graph_cp(x[:1], seen[:1], u[:1])
    expected = ["repetition_penalty", "temperature", "top_k", "min_p", "top_p", "draw"]
    assert host_calls == graph_calls == expected
    host_calls.clear()
    S.choose("talker", x[0], SAMPLING, talker_inputs(0.5))
    assert host_calls == TALKER[:5] + ["min_p"] + TALKER[5:]
    assert host_cp(x, seen, u) == before_host and graph_cp(x, seen, u) == before_graph == before_host


# ---------------------------------------------------------------- one place for the ranges
@pytest.mark.parametrize("key, generator, field, good, bad, message", [
    ("KZTTS_TEMP", "talker", "temperature", "0.7", "-1", "a number >= 0 (0 = greedy)"),
    ("KZTTS_TOPK", "talker", "top_k", "7", "x", "an integer >= 0 (0 = off)"),
    ("KZTTS_TOPP", "talker", "top_p", "0.5", "0", "a number in (0, 1]"),
    ("KZTTS_REPP", "talker", "repetition_penalty", "1.2", "0", "a number > 0 (1 = off)"),
    ("KZTTS_CP_TEMP", "code_predictor", "temperature", "0.7", "nan", "a number >= 0 (0 = greedy)"),
    ("KZTTS_CP_TOPK", "code_predictor", "top_k", "7", "-2", "an integer >= 0 (0 = off)"),
    ("KZTTS_CP_TOPP", "code_predictor", "top_p", "0.5", "1.5", "a number in (0, 1]"),
    ("KZTTS_CP_REPP", "code_predictor", "repetition_penalty", "1.2", "inf", "a number > 0 (1 = off)"),
])
def test_overrides_use_the_ranges_of_the_description(key, generator, field, good, bad, message):
    base = reference_settings()
    changed = with_overrides(base, {key: good})
    assert getattr(getattr(changed, generator), field) == C.setting_range(field).parse(key, good)
    assert dataclasses.replace(getattr(changed, generator), **{field: getattr(getattr(base, generator), field)}) \
        == getattr(base, generator)
    verdict = "is not valid" if bad == "x" else "is out of range"
    with pytest.raises(KzttsError, match="^" + re.escape(f"{key}='{bad}' {verdict}: expected {message}") + "$"):
        with_overrides(base, {key: bad})


def test_validate_and_parse_share_one_check():
    for r in C.RANGES:
        bad = "-1" if r.name != "top_p" else "1.5"
        with pytest.raises(KzttsError, match="out of range"):
            r.parse("X", bad)
        value = int(bad) if r.integer else float(bad)
        with pytest.raises(KzttsError, match="^" + re.escape(f"cp {r.name} must be {r.rule}, got {value!r}") + "$"):
            SamplingParams(**{**dict(temperature=0.9, top_k=50, top_p=1.0), r.name: value}).validate("cp ")
