"""The Code Predictor as ONNX graphs: a per-step graph with KV I/O and a whole-frame graph.

The Code Predictor (docs/QWEN3_TTS.md, "Code Predictor") turns the talker's final-norm hidden
``h`` and the frame's first code ``c0`` into codes ``c1..c15``: a fresh KV cache per frame,
prefill ``[h, C(c0)]`` at positions 0-1 -> head 0 -> c1, then for g = 1..14 embed ``c_g``
with ``cp.codec_embedding[g-1]`` -> head g -> ``c_{g+1}``. Every input goes through
``small_to_mtp_projection`` (Identity when the code predictor is as wide as the talker).

``cp_step`` (variant "dynamic", CPU)
    inputs  ``inputs_embeds`` f32 [1, T, talker_H] (talker-sized; the graph projects),
            ``rope_cos``/``rope_sin`` f32 [1, T, head_dim], ``step`` int64 [1] (head 0..14),
            ``past_key_{l}``/``past_value_{l}`` f32 [1, kv_heads, P, head_dim]
    outputs ``logits`` f32 [1, vocab] (head ``step`` on the last position),
            ``new_key_{l}``/``new_value_{l}`` f32 [1, kv_heads, T, head_dim]
    The 15 heads stay 15 plain ``MatMul`` weights ``cp_head_{g}`` [cp_H, vocab]; ``step``
    picks one through a depth-4 binary tree of ``If`` nodes, so only the selected head
    is read (computing all 15 and selecting would read 15x the head weights every step;
    a ``Gather`` over one stacked [15, vocab, cp_H] tensor is what int4 ``MatMulNBits``
    quantisation cannot touch). ORT's MatMulNBits quantizer walks ``If`` subgraphs.

``cp_frame`` (variant "static": fixed shapes, no Loop/If; CPU and HTP)
    inputs  ``hidden`` f32 [1, talker_H], ``c0_embed`` f32 [1, talker_H] (= C(c0), the row
            of the bundle's ``codec_embedding`` table: the graph does not duplicate the
            talker table), ``temperature`` f32 [1], ``top_k`` int64 [1], ``top_p`` f32 [1],
            ``repetition_penalty`` f32 [1], ``uniforms`` f32 [15]
    outputs ``codes`` int64 [15] (c1..c15) and ``embedding_sum`` f32 [1, talker_H] =
            sum_{g=1..15} cp.codec_embedding[g-1](c_g), added in order g = 1, 2, ...
    The next talker input is ``C(c0) + embedding_sum + text``. All 15 steps are unrolled
    with static KV concatenation (2, 3, ..., 16 positions); RoPE tables for positions
    0..15 are constants built by ``kztts.runners.rope.rope_tables`` (the host's own tables); the
    prefill's causal mask is a finite -1e4 (exactly 0 after exp in fp32, safe in fp16).
    Sampling happens in the graph with ``sample_rows`` below, generated from the Code
    Predictor's chain in ``kztts.generation.sampling_chain`` (the description the host sampler runs
    too) with the host's float32 operations, so on the CPU it picks the host's token bit
    for bit.
    ``repetition_penalty`` penalises codes already drawn earlier in the same frame
    (c1..c_{g-1}; c0 is not counted), 1.0 = off (the reference). Greedy when
    ``temperature <= 0`` or ``top_k == 1``: exact argmax, lowest id on ties.

``sample_rows`` uses only TopK (a full sort in ``cp_frame``; in ``cp_frame_gqa``, CPU only,
a TopK of the batch's largest k to find each row's k-th score, then a TopK of only the ids
top-k keeps, ties included: the draw order the host sorts, cut where its top-k cuts), ArgMax, CumSum (over sorted values), Less/
LessOrEqual -> Cast -> ReduceSum, GatherElements, Gather, Where, Floor, Min/Max and
elementwise arithmetic: no ScatterND, Loop or If (all placed on QNN by the HTP simulator).
The HTP computes it in fp16, so there it matches the host only up to fp16 rounding.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from kztts.bundle.manifest import GraphSpec
from kztts.export.common.onnx_export import export_onnx
from kztts.export.common.qwen3_stack import Qwen3Stack, example_stack_inputs, kv_io_names
from kztts.export.common.graph_parts import graph_spec
from kztts.generation import sampling as S
from kztts.generation import sampling_chain
from kztts.generation.sampling_chain import PROCESSOR
from kztts.runners.rope import rope_tables

log = logging.getLogger(__name__)

FLT_MAX = float(np.finfo(np.float32).max)
STEP_FILE = "graphs/cp_step.onnx"
FRAME_FILE = "graphs/cp_frame.onnx"
FRAME_INPUTS = ["hidden", "c0_embed", "temperature", "top_k", "top_p", "repetition_penalty", "uniforms"]
FRAME_OUTPUTS = ["codes", "embedding_sum"]
SAMPLER_INPUTS = ["logits", "seen", "temperature", "top_k", "top_p", "repetition_penalty", "uniform"]


# ---------------------------------------------------------------- in-graph sampler
def _const(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float32))


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """``kztts.generation.sampling.exp_f32`` as torch ops (Max, Mul, Add, Sub, Floor, Cast, Gather, Where):
    the same float32 operations in the same order, so ONNX Runtime gives the host's bits."""
    xc = torch.maximum(x, _const(S.EXP_MIN))
    n = torch.floor(xc * _const(S.EXP_LOG2E) + _const(0.5))
    r = xc - n * _const(S.EXP_C1)
    r = r - n * _const(S.EXP_C2)
    z = r * r
    y = torch.zeros_like(r) + _const(S.EXP_POLY[0])
    for c in S.EXP_POLY[1:]:
        y = y * r + _const(c)
    y = y * z + r + _const(1.0)
    e = y * _const(S.POW2_NEG)[(-n).to(torch.int64)]
    return torch.where(x < _const(S.EXP_MIN), torch.zeros_like(e), e)


@dataclass
class GraphInputs:
    """What the in-graph steps read: ``seen`` bool [B, V] (the repetition penalty's history),
    ``params`` the ``SamplingParams`` fields by name ([B] each), ``u`` f32 [B] (the draw's uniform)."""

    seen: torch.Tensor
    params: dict[str, torch.Tensor]
    u: torch.Tensor


class Rows:
    """What the in-graph chain hands from step to step: the scores [B, V] in vocabulary order
    until a step needs the draw order; then the scores and ids in draw order (``TopK``, once)
    and unnormalised probabilities ``e = exp_f32(s - max)`` in that order (0 = removed).

    ``select_k``: the top-k step sets ``limit``, how many ids of the draw order can still be
    drawn (the largest k of the batch plus ties at each row's k-th score), and the draw order
    is a ``TopK`` of ``limit`` ids instead of a sort of the whole vocabulary. Without it (the
    static graph of the HTP, where TopK needs a constant k) the draw order is a full sort."""

    def __init__(self, scores: torch.Tensor, select_k: bool = False):
        self.vocab = scores.shape[-1]  # read once: one Shape node in a dynamic-vocab graph
        self.select_k = select_k
        self.limit: torch.Tensor | None = None
        self._scores = scores
        self._sorted: tuple[torch.Tensor, torch.Tensor] | None = None
        self.probs: torch.Tensor | None = None
        self.token: torch.Tensor | None = None

    @property
    def scores(self) -> torch.Tensor:
        if self._sorted is not None:
            raise NotImplementedError("an in-graph sampling step needs the scores in vocabulary order after a "
                                      "step sorted them: keep vocabulary-order steps before top-k")
        return self._scores

    @scores.setter
    def scores(self, value: torch.Tensor) -> None:
        _ = self.scores  # same check
        self._scores = value

    @property
    def width(self):
        """Ids in the draw order: ``limit`` once the top-k step set it, else the vocabulary."""
        return self.vocab if self.limit is None else self.limit

    def draw_order(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores and their ids, descending, ties by lower id (the host's draw order)."""
        if self._sorted is None:
            self._sorted = torch.topk(self._scores, self.width, dim=-1, largest=True, sorted=True)
        return self._sorted

    def probabilities(self) -> torch.Tensor:
        if self.probs is None:
            vals = self.draw_order()[0]
            self.probs = exp_f32(vals - vals[:, :1])
        return self.probs


def _greedy(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Rows that take the argmax (bool [B]): ``temperature <= 0`` or ``top_k == 1``."""
    return (params["temperature"] <= _const(0.0)) | (params["top_k"] == 1)


def _repetition_penalty(rows: Rows, inp: GraphInputs) -> None:
    x, zero = rows.scores, _const(0.0)
    rp = inp.params["repetition_penalty"].unsqueeze(-1)
    rows.scores = torch.where(inp.seen, torch.where(x < zero, x * rp, x / rp), x)


def _temperature(rows: Rows, inp: GraphInputs) -> None:
    t = inp.params["temperature"].unsqueeze(-1)
    t = torch.where(t > _const(0.0), t, torch.ones_like(t))  # greedy rows ignore it; avoid x / 0
    rows.scores = torch.minimum(rows.scores / t, _const(FLT_MAX))


def _top_k(rows: Rows, inp: GraphInputs) -> None:
    v = rows.vocab
    k = inp.params["top_k"].unsqueeze(-1)
    on = (k > 0) & (k < v)
    k = torch.where(on, k, torch.full_like(k, v))
    if rows.select_k:
        greedy = _greedy(inp.params).unsqueeze(-1)
        k = torch.where(greedy, torch.ones_like(k), k)  # one id: the draw of a greedy row is not used
        _select_k(rows, k, on | greedy)
    vals = rows.draw_order()[0]
    keep = vals >= torch.gather(vals, 1, k - 1)  # a prefix of the draw order
    rows.probs = torch.where(keep, rows.probabilities(), torch.zeros_like(vals))


def _select_k(rows: Rows, k: torch.Tensor, partial: torch.Tensor) -> None:
    """Set ``rows.limit``: the ids the host's top-k keeps (every score >= the row's k-th
    largest, ties included), as many as the widest row needs. A TopK of the batch's largest
    k over the ``partial`` rows finds their k-th score; any other row keeps the whole
    vocabulary (its k-th score is the minimum)."""
    s = rows.scores
    k_sel = torch.where(partial, k, torch.ones_like(k))
    top = torch.topk(s, torch.max(k_sel), dim=-1, largest=True, sorted=True)[0]
    kth = torch.where(partial, torch.gather(top, 1, k_sel - 1), torch.amin(s, dim=-1, keepdim=True))
    rows.limit = torch.max((s >= kth).to(torch.int64).sum(-1))


def _top_p(rows: Rows, inp: GraphInputs) -> None:
    # running sum in ascending order (reversed draw order), smallest first
    e = rows.probabilities()
    asc_cum = torch.flip(torch.cumsum(torch.flip(e, [-1]), dim=-1), [-1])
    tp = inp.params["top_p"].unsqueeze(-1)
    not_top = torch.arange(rows.width).unsqueeze(0) > 0
    remove = (asc_cum <= (_const(1.0) - tp) * asc_cum[:, :1]) & (tp < _const(1.0)) & not_top
    rows.probs = torch.where(remove, torch.zeros_like(e), e)  # removes a suffix of the draw order


def _draw(rows: Rows, inp: GraphInputs) -> None:
    e = rows.probabilities()
    cum = torch.cumsum(e, dim=-1)
    n = (cum <= inp.u.unsqueeze(-1) * cum[:, -1:]).to(torch.int64).sum(-1)
    last = (e > _const(0.0)).to(torch.int64).sum(-1) - 1
    pos = torch.clamp(torch.minimum(n, last), min=0)
    rows.token = torch.gather(rows.draw_order()[1], 1, pos.unsqueeze(-1)).squeeze(-1)


# One torch implementation per step name of the Code Predictor's chain (kztts.generation.sampling_chain);
# each updates the Rows in place and "draw" sets its token.
GRAPH_STEPS: dict[str, Callable[[Rows, GraphInputs], None]] = {
    "repetition_penalty": _repetition_penalty,
    "temperature": _temperature,
    "top_k": _top_k,
    "top_p": _top_p,
    "draw": _draw,
}
_GRAPH_SIDE = "in-graph (kztts.export.graphs.code_predictor_graph.GRAPH_STEPS)"
# a step of the chain without a graph implementation fails the import
sampling_chain.implementations(sampling_chain.chain("code_predictor"), GRAPH_STEPS, _GRAPH_SIDE)


def sample_chain(logits: torch.Tensor, inputs: GraphInputs, select_k: bool = False) -> torch.Tensor:
    """Tokens int64 [B] from ``logits`` f32 [B, V] by the Code Predictor's chain, step by step
    as ``kztts.generation.sampling_chain`` lists it; the greedy rows take the argmax of the scores after
    the processors (``temperature <= 0`` or ``top_k == 1``). ``select_k``: see ``Rows``."""
    steps = sampling_chain.chain("code_predictor")
    rows, greedy_token = Rows(logits, select_k), None
    for step, build in zip(steps, sampling_chain.implementations(steps, GRAPH_STEPS, _GRAPH_SIDE)):
        if step.kind != PROCESSOR and greedy_token is None:
            greedy_token = torch.argmax(rows.scores, dim=-1)
        build(rows, inputs)
    return torch.where(_greedy(inputs.params), greedy_token, rows.token)


def sample_rows(logits: torch.Tensor, seen: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, repetition_penalty: torch.Tensor, u: torch.Tensor,
                select_k: bool = False) -> torch.Tensor:
    """One token per row with the chain of ``kztts.generation.sampling`` (see its determinism contract):
    repetition penalty on ``seen`` ids -> temperature -> top-k -> top-p -> inverse-CDF draw,
    or argmax when ``temperature <= 0`` or ``top_k == 1``; built by ``sample_chain`` from
    ``kztts.generation.sampling_chain``.

    logits f32 [B, V]; seen bool [B, V]; temperature, top_p, repetition_penalty, u f32 [B];
    top_k int64 [B] -> tokens int64 [B]. ONNX: TopK (descending, ties by lower id; the whole
    vocabulary, or with ``select_k`` only the ids top-k keeps), CumSum over sorted values
    only, GatherElements, Where, Less/LessOrEqual -> Cast -> ReduceSum, elementwise ops; no
    ScatterND / Loop / If. (In eager torch, cumsum accumulates in double on the CPU, so eager
    results may differ from the graph's at rounding boundaries.)
    """
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty)
    return sample_chain(logits, GraphInputs(seen, params, u), select_k)


class SamplerGraph(nn.Module):
    """``sample_rows`` alone, for tests and for checking placement on an execution provider."""

    def __init__(self, select_k: bool = False):
        super().__init__()
        self.select_k = select_k

    def forward(self, logits, seen, temperature, top_k, top_p, repetition_penalty, uniform):
        return sample_rows(logits, seen, temperature, top_k, top_p, repetition_penalty, uniform, self.select_k)


def export_sampler(path: Path, select_k: bool = False) -> Path:
    """``sample_rows`` as an ONNX graph with dynamic batch and vocab: inputs SAMPLER_INPUTS, output ``token``."""
    b, v = 3, 7
    g = torch.Generator().manual_seed(0)
    example = (torch.randn(b, v, generator=g), torch.zeros(b, v, dtype=torch.bool), torch.full((b,), 0.9),
               torch.full((b,), 3, dtype=torch.int64), torch.full((b,), 0.8), torch.ones(b), torch.rand(b, generator=g))
    dyn = {"logits": {0: "batch", 1: "vocab"}, "seen": {0: "batch", 1: "vocab"}, "token": {0: "batch"}}
    dyn.update({n: {0: "batch"} for n in SAMPLER_INPUTS[2:]})
    return export_onnx(SamplerGraph(select_k).eval(), example, Path(path), SAMPLER_INPUTS, ["token"], dyn)


# ---------------------------------------------------------------- shapes
@dataclass(frozen=True)
class CodePredictorShape:
    num_layers: int
    hidden: int  # code predictor hidden
    talker_hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    vocab: int
    num_groups: int  # code groups predicted per frame (15)


def code_predictor_shape(model) -> CodePredictorShape:
    tc = model.config.talker_config
    cpc = tc.code_predictor_config
    head_dim = getattr(cpc, "head_dim", None) or cpc.hidden_size // cpc.num_attention_heads
    rs = getattr(cpc, "rope_scaling", None) or {}
    if rs.get("rope_type", rs.get("type", "default")) != "default":
        raise NotImplementedError(f"code predictor rope_scaling {rs} is not supported (only default 1-D RoPE)")
    cp = model.talker.code_predictor
    return CodePredictorShape(cpc.num_hidden_layers, cpc.hidden_size, tc.hidden_size, cpc.num_attention_heads,
                              cpc.num_key_value_heads, head_dim, float(cpc.rope_theta), cpc.vocab_size,
                              len(cp.lm_head))


def _stack(cp, s: CodePredictorShape) -> Qwen3Stack:
    return Qwen3Stack(cp.model.layers, cp.model.norm, num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                      head_dim=s.head_dim)


# ---------------------------------------------------------------- cp_step
class CodePredictorStepStack(nn.Module):
    """projection -> CP stack; returns the last position's final-norm hidden and the new KV.
    The head selection (``step``) is added to the ONNX graph afterwards (``_add_head_tree``)."""

    def __init__(self, model):
        super().__init__()
        cp = model.talker.code_predictor
        self.shape = code_predictor_shape(model)
        self.proj = cp.small_to_mtp_projection
        self.stack = _stack(cp, self.shape)

    def forward(self, inputs_embeds, rope_cos, rope_sin, *past):
        h, new_k, new_v = self.stack(self.proj(inputs_embeds), rope_cos, rope_sin, past[0::2], past[1::2])
        return (h[:, -1], *[t for pair in zip(new_k, new_v) for t in pair])

    def io_names(self):
        kv_in, kv_out = kv_io_names(self.shape.num_layers)
        return ["inputs_embeds", "rope_cos", "rope_sin", *kv_in], ["hidden", *kv_out]

    def example_inputs(self, t: int = 2, p: int = 1):
        s = self.shape
        return example_stack_inputs(t, p, s.talker_hidden, s.head_dim, s.num_kv_heads, s.num_layers)


def _add_head_tree(path: Path, heads: list[np.ndarray]) -> None:
    """Replace output ``hidden`` [1, cp_H] by ``logits`` = hidden @ heads[step] via nested If nodes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    g = model.graph
    n = len(heads)
    vocab = heads[0].shape[1]
    for i, w in enumerate(heads):
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w, dtype=np.float32), f"cp_head_{i}"))
    g.input.insert(3, helper.make_tensor_value_info("step", TensorProto.INT64, [1]))

    def branch(lo: int, hi: int, out: str) -> list:
        """Nodes computing ``out`` = hidden @ heads[step] for step in [lo, hi)."""
        if hi - lo == 1:
            return [helper.make_node("MatMul", ["hidden", f"cp_head_{lo}"], [out], name=f"cp_head_matmul_{lo}")]
        mid = (lo + hi) // 2
        cond = f"step_lt_{mid}"
        subs = []
        for tag, (a, b) in (("then", (lo, mid)), ("else", (mid, hi))):
            sub_out = f"{out}_{tag}"
            subs.append(helper.make_graph(branch(a, b, sub_out), f"heads_{a}_{b}", [],
                                          [helper.make_tensor_value_info(sub_out, TensorProto.FLOAT, [1, vocab])]))
        return [helper.make_node("If", [cond], [out], name=f"heads_{lo}_{hi}", then_branch=subs[0],
                                 else_branch=subs[1])]

    nodes = []
    for mid in sorted({(lo + hi) // 2 for lo, hi in _splits(0, n)}):
        nodes.append(helper.make_node("Constant", [], [f"const_{mid}"],
                                      value=numpy_helper.from_array(np.array([mid], np.int64), f"const_{mid}_v")))
        nodes.append(helper.make_node("Less", ["step", f"const_{mid}"], [f"step_lt_{mid}"]))
    nodes += branch(0, n, "logits")
    g.node.extend(nodes)
    outs = [o for o in g.output if o.name != "hidden"]
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, vocab]))
    g.output.extend(outs)
    _save(model, path)


def _splits(lo: int, hi: int):
    if hi - lo > 1:
        mid = (lo + hi) // 2
        yield lo, hi
        yield from _splits(lo, mid)
        yield from _splits(mid, hi)


def _save(model, path: Path) -> None:
    import onnx

    path = Path(path)
    big = model.ByteSize() > 1_800_000_000
    for f in path.parent.glob(path.name + ".data"):
        f.unlink()
    onnx.save_model(model, str(path), save_as_external_data=big, all_tensors_to_one_file=True,
                    location=path.name + ".data" if big else None)


def export_cp_step(model, path: Path) -> Path:
    graph = CodePredictorStepStack(model).eval()
    ins, outs = graph.io_names()
    dyn = {"inputs_embeds": {1: "seq"}, "rope_cos": {1: "seq"}, "rope_sin": {1: "seq"}}
    dyn.update({n: {2: "past"} for n in ins[3:]})
    dyn.update({n: {2: "seq"} for n in outs[1:]})
    export_onnx(graph, graph.example_inputs(), Path(path), ins, outs, dyn)
    heads = [h.weight.detach().float().numpy().T for h in model.talker.code_predictor.lm_head]
    _add_head_tree(Path(path), heads)
    return Path(path)


# ---------------------------------------------------------------- cp_frame
class CodePredictorFrame(nn.Module):
    """All 15 code-predictor steps of one frame, unrolled, sampling in the graph.

    ``SELECT_K`` (``sample_rows``' ``select_k``): False here, a static graph the HTP runs
    too (its TopK sorts the whole vocabulary); the CPU-only subclass sets it."""

    SELECT_K = False

    def __init__(self, model):
        super().__init__()
        cp = model.talker.code_predictor
        s = self.shape = code_predictor_shape(model)
        self.proj = cp.small_to_mtp_projection
        self.stack = _stack(cp, s)
        self.heads = cp.lm_head
        self.embeds = cp.model.codec_embedding
        positions = s.num_groups + 1  # [h, C(c0)] + c1..c14 fed back
        cos, sin = rope_tables(positions, s.head_dim, s.rope_theta)
        self.register_buffer("rope_cos", torch.from_numpy(cos)[None], persistent=False)
        self.register_buffer("rope_sin", torch.from_numpy(sin)[None], persistent=False)

    def forward(self, hidden, c0_embed, temperature, top_k, top_p, repetition_penalty, uniforms):
        s = self.shape
        x = self.proj(torch.cat([hidden, c0_embed], dim=0).unsqueeze(0))  # [1, 2, cp_H]
        empty = torch.zeros(1, s.num_kv_heads, 0, s.head_dim)
        keys, values = [empty] * s.num_layers, [empty] * s.num_layers
        seen = torch.zeros(1, s.vocab, dtype=torch.bool)
        ids = torch.arange(s.vocab).unsqueeze(0)
        codes, total, pos = [], None, 0
        for g in range(s.num_groups):
            t = x.shape[1]
            h, keys, values = self._layers(x, pos, keys, values)
            pos += t
            logits = self.heads[g](h[:, -1])  # [1, vocab]
            code = sample_rows(logits, seen, temperature, top_k, top_p, repetition_penalty, uniforms[g:g + 1],
                               self.SELECT_K)
            codes.append(code)
            seen = seen | (ids == code.unsqueeze(-1))
            e = self.embeds[g](code)  # [1, talker_H]
            total = e if total is None else total + e
            if g + 1 < s.num_groups:
                x = self.proj(e).unsqueeze(0)
        return torch.cat(codes), total

    def _layers(self, x, pos: int, keys, values):
        """The stack over the step's positions pos.. with the KV so far: (hidden, keys, values)."""
        t = x.shape[1]
        # prefill: position 0 must not see position 1. A finite -1e4 instead of -inf: exp()
        # gives exactly 0 in fp32 either way, and fp16 (HTP) has no trouble with it.
        mask = torch.tensor([[0.0, -1e4], [0.0, 0.0]]) if pos == 0 else torch.zeros(1, pos + 1)
        h, new_k, new_v = self.stack(x, self.rope_cos[:, pos:pos + t], self.rope_sin[:, pos:pos + t], keys, values,
                                     mask=mask)
        return (h, [torch.cat([a, b], dim=2) for a, b in zip(keys, new_k)],
                [torch.cat([a, b], dim=2) for a, b in zip(values, new_v)])

    def example_inputs(self):
        s = self.shape
        g = torch.Generator().manual_seed(0)
        return (torch.randn(1, s.talker_hidden, generator=g), torch.randn(1, s.talker_hidden, generator=g),
                torch.tensor([0.9]), torch.tensor([50], dtype=torch.int64), torch.tensor([1.0]),
                torch.tensor([1.0]), torch.rand(s.num_groups, generator=g))


def export_cp_frame(model, path: Path) -> Path:
    graph = CodePredictorFrame(model).eval()
    return export_onnx(graph, graph.example_inputs(), Path(path), FRAME_INPUTS, FRAME_OUTPUTS)


# ---------------------------------------------------------------- bundle entry point
def export_code_predictor(model, bundle_dir: Path, export_id: str = "unbundled") -> dict[str, GraphSpec]:
    """Write ``graphs/cp_step.onnx`` and ``graphs/cp_frame.onnx``; return their manifest specs
    (``export_id`` is the bundle's stamp, see ``bundle_writer.graph_spec``)."""
    bundle_dir = Path(bundle_dir)
    export_cp_step(model, bundle_dir / STEP_FILE)
    export_cp_frame(model, bundle_dir / FRAME_FILE)
    return {"cp_step": graph_spec(bundle_dir, "cp_step", STEP_FILE, "dynamic", "fp32", export_id),
            "cp_frame": graph_spec(bundle_dir, "cp_frame", FRAME_FILE, "static", "fp32", export_id)}
