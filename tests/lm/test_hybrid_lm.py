"""Hybrid LMs (Qwen3-Next / Qwen3.5: Gated DeltaNet + gated attention): tiny random ``qwen3_next`` models, dense and
MoE, built with transformers' classes (``kztts.export.lm.hybrid_tiny``), exported to LM bundles with the static graphs
of the small simulator target; the runtime against transformers, the chunked delta rule against the recurrent one,
chat sessions against a re-prefill, ``kztts chat`` against transformers' greedy continuation, the HTP prefill handed to
the CPU decode on the simulator, calibration and the fp16 guard over the DeltaNet probes, the cost report."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from kztts.core.errors import ContextOverflowError, KzttsError

from support import assert_equals_reprefill, cosine, empty_gguf, plain_greedy_lm

KINDS = ("qwen3_next", "qwen3_next_moe")
STEPS = 32
PROMPT = "Hello, how are you? Bonjour 你好"
# Chunked against token-by-token (the recurrent decode graph): the largest state or KV difference relative to the
# tensor's largest magnitude. The CPU prefill graph's chunks and transformers' cache: measured 3.8e-6 and 1.45e-5
# at worst (dense and MoE), fp32 noise; the bound leaves 13x.
STATE_REL = 2e-4
# The static prefill graph's padded 16-position chunks: measured 1.56e-5 (dense) and 1.45e-4 (MoE: its states
# through four chunks of two routed experts' sums); the bound leaves 7x. A padded position counted as a token
# (token_mask 1 everywhere) gives 1.7 (dense) and 2.0 (MoE).
STATIC_STATE_REL = 1e-3
# The static graphs' attention KV I/O is float16 (the HTP's default KV type): rounding adds up to 2^-11 of a value.
F16_ROUND = 2.0 ** -11
# The HTP prefill's states and KV handed to the CPU decode, teacher-forced against all-CPU: measured cosine min
# 0.999991 (dense) and 0.999983 (MoE), top-1 1.0; the bound leaves over 50x the distance to 1.
HTP_COS = 0.999
# Every step on the HTP (all-htp): measured cosine min 0.99974 (dense), 0.98687 (MoE: a router near-tie selects
# another expert in one fp16 decode step); the bounds leave ~4x the distance to 1.
ALL_HTP_COS = {"qwen3_next": 0.999, "qwen3_next_moe": 0.95}
# The MoE model: measured cosine min 0.99998 on this test's text (French), where its routers' top-2 margins go down to
# 0.0003 without a flip. On the English PROMPT's greedy continuation one position's router (probabilities 0.0075
# apart) selects another expert after the fp16 prefill, a different function: logits cosine 0.986 there
# (benchmarks/hybrid_lm/README.md); a top-k router is discontinuous, no bound on fp16 error excludes that.


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def hybrid_dir(kind):
    from kztts.export.lm.hybrid_tiny import cached_tiny_hybrid

    return cached_tiny_hybrid(kind)


@pytest.fixture(scope="module")
def bundle(hybrid_dir, small_target):
    """The CPU graphs and the static graphs of the small simulator target (context 64, chunk 16)."""
    from kztts.export.lm.hybrid import cached_hybrid_bundle

    return cached_hybrid_bundle(hybrid_dir, target=str(small_target))


@pytest.fixture(scope="module")
def hf_model(hybrid_dir):
    return plain_greedy_lm(hybrid_dir)


def test_bundle_is_a_hybrid_lm_bundle(bundle, kind):
    from kztts.bundle import graphs as G
    from kztts.bundle.manifest import read_manifest

    m = read_manifest(bundle)
    assert m.kind == "lm" and m.data["model_type"] == "qwen3_next" and m.hybrid
    assert set(m.graphs) == set(G.HYBRID_CPU_GRAPHS + G.HYBRID_STATIC_GRAPHS)
    cfg = m.talker
    assert cfg["layer_types"] == ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
    assert (cfg["num_experts"], cfg["num_experts_per_tok"]) == ((4, 2) if kind.endswith("moe") else (0, 0))
    assert cfg["rotary_dim"] == 4 and cfg["conv_dim"] == 2 * 2 * 16 + 4 * 8
    assert m.data["chat"]["template_matches"] is True
    # the cache I/O: KV for the attention layer, both states for each DeltaNet layer, in layer order
    names = [t.name for t in m.graphs["hybrid_decode"].inputs]
    assert names[3:] == ["past_conv_state_0", "past_recurrent_state_0", "past_conv_state_1", "past_recurrent_state_1",
                         "past_key_2", "past_value_2", "past_conv_state_3", "past_recurrent_state_3"]
    shapes = {t.name: t.shape for t in m.graphs["hybrid_static_prefill"].outputs}
    assert shapes["new_recurrent_state_3"] == (1, 4, 16, 8) and shapes["new_conv_state_3"] == (1, 96, 3)
    assert shapes["new_key_2"] == (2, 1, 16, 16) and shapes["layer_stats"] == (4, len(G.DELTANET_STATS))


def test_greedy_tokens_and_logits_match_transformers(bundle, hf_model):
    """32 greedy tokens equal transformers' generate (with the checkpoint's repetition penalty, 1.05, which the host
    sampler applies too); teacher-forced logits cosine >= 0.99999 (measured >= 0.9999999968, max |diff| 4.6e-4)."""
    import torch
    from transformers import GenerationConfig

    from kztts.lm.lm import LM, Reply

    lm = LM(bundle)
    assert lm.plan.runner == "hybrid-cpu"
    lm.stop_ids = frozenset()  # transformers below runs without an eos: compare all 32 steps
    ids = lm.encode(PROMPT)
    penalty = lm.params.repetition_penalty
    assert penalty == 1.05
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                generation_config=GenerationConfig(max_new_tokens=STEPS, do_sample=False,
                                                                   repetition_penalty=penalty))
        ref = out[0, len(ids):].tolist()
        ref_logits = hf_model(out[:, :-1]).logits[0, len(ids) - 1:].numpy()
    reply = Reply()
    text = "".join(lm.generate(PROMPT, STEPS, greedy=True, reply=reply))
    assert reply.ids == ref and reply.stopped_by == "max_new_tokens" and text == lm.decode(ref)
    lm._claim(object())
    got = [lm.feed(ids)] + [lm.feed([t]) for t in ref[:-1]]
    cos = min(cosine(a, b) for a, b in zip(got, ref_logits))
    diff = max(float(np.abs(a - b).max()) for a, b in zip(got, ref_logits))
    print(f"{STEPS} greedy tokens equal; teacher-forced logits cosine min {cos:.10f}, max |diff| {diff:.2e}")
    assert cos >= 0.99999, cos


def _states(cache) -> dict:
    return {(i, k): np.array(a) for i, s in cache.items() for k, a in s.items()}


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def test_chunked_prefill_state_equals_token_by_token(bundle, hf_model):
    """The states after a 63-token text: the chunked CPU prefill graph and transformers' own cache (STATE_REL), the
    static prefill graph on the CPU EP (padded 16-position chunks, token_mask; STATIC_STATE_REL), each against the
    recurrent decode graph fed token by token; the attention KV likewise."""
    import onnxruntime as ort
    import torch

    from kztts.eval.lm_accuracy import SAMPLES
    from kztts.lm.lm import LM
    from kztts.runners.hybrid_static import HybridStaticTalker

    lm = LM(bundle)
    ids = lm.encode(SAMPLES[1].text)[:63]
    x = lm.embed(ids)
    runner = lm.runner
    runner.chunk = 48  # two chunked calls (48 + 15): a chunk boundary inside the text
    runner.prefill(x)
    chunked, chunked_kv = _states(runner.cache.states), [a.copy() for a in runner.cache.kv.past(0)]
    runner.prefill(x[:1])
    for j in range(1, len(ids)):
        runner.extend(x[j:j + 1])
    stepwise, stepwise_kv = _states(runner.cache.states), runner.cache.kv.past(0)
    m = lm.bundle.manifest
    sessions = [ort.InferenceSession(str(bundle / m.graphs[n].file), providers=["CPUExecutionProvider"])
                for n in ("hybrid_static_prefill", "hybrid_static_decode")]
    static = HybridStaticTalker(*sessions, m.talker)
    static.prefill(x)
    assert static.calls == {"prefill": 4, "decode": 0}  # 16 + 16 + 16 + 15 (one padded position)
    keys, values, static_states = static.float_cache()
    with torch.no_grad():
        cache = hf_model(torch.tensor([ids]), use_cache=True).past_key_values
    hf = {(i, k): (cache.conv_states[i][..., 1:] if k == "conv_state" else cache.recurrent_states[i]).numpy()
          for i, k in stepwise}  # transformers keeps `kernel` conv inputs; the first one is never read again
    worst = {}
    for key, want in stepwise.items():
        for name, got in (("chunked", chunked[key]), ("static", static_states[key[0]][key[1]]), ("hf", hf[key])):
            worst[name] = max(worst.get(name, 0.0), _rel(got, want))
    for name, (k, v) in (("chunked kv", chunked_kv), ("static kv", (keys[0], values[0]))):
        worst[name] = max(_rel(k, stepwise_kv[0]), _rel(v, stepwise_kv[1]))
    print("largest difference / largest magnitude, against token by token: "
          + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    static_kv, static = worst.pop("static kv"), worst.pop("static")
    assert max(worst.values()) < STATE_REL and static < STATIC_STATE_REL, (worst, static)
    assert static_kv < F16_ROUND + STATE_REL, static_kv


def test_chat_session_equals_full_reprefill(bundle):
    """Three turns kept in the cache (the KV and both DeltaNet states; one prefill in all, later turns feed only their
    own ChatML) equal a full re-prefill of the conversation before each reply: tokens and logits."""
    from kztts.generation.sampling import SamplingParams
    from kztts.lm.lm import LM

    lm = LM(bundle)
    session = lm.chat_session(system="Be brief.")
    prefills = []
    real = lm.runner.prefill
    lm.runner.prefill = lambda x: prefills.append(len(x)) or real(x)
    turns = []
    for text in ("Hi!", "Bonjour, ça va ?", "你好"):
        before = len(lm.history)
        last = session.replies[-1] if session.replies else None
        pending = last.ids[-1:] if last is not None and last.stopped_by == "max_new_tokens" else []
        turn = lm.encode(session.prompt_text(text))
        list(session.send(text, 12, params=SamplingParams.greedy_params(), keep_logits=True))
        assert lm.history[before:before + len(pending) + len(turn)] == pending + turn
        turns.append(turn)  # a cut reply's last token is in its ids: the re-prefill has it before this turn
    assert len(prefills) == 1, "later turns must extend the cache, not prefill again"
    lm.runner.prefill = real
    assert_equals_reprefill(lm, turns, session.replies, atol=1e-3)


def _hf_chat(hf_model, lm, turns: list[str], max_new: int, system: str) -> list[list[int]]:
    """transformers' greedy continuation (the checkpoint's repetition penalty, stop at an end id) of the ChatML a
    session feeds: each turn's ids after the previous ones and the replies."""
    import torch
    from transformers import GenerationConfig

    from kztts.lm import chatml

    ids: list[int] = []
    replies = []
    stops = sorted(lm.stop_ids)
    for i, text in enumerate(turns):
        if replies and replies[-1][-1] not in stops:
            ids.append(replies[-1][-1])  # a reply cut by max_new_tokens: its last token was not fed yet
        ids += lm.encode(chatml.first_turn(system, text) if i == 0 else chatml.next_turn(text))
        cfg = GenerationConfig(max_new_tokens=max_new, do_sample=False, repetition_penalty=lm.params.repetition_penalty,
                               eos_token_id=stops, pad_token_id=stops[0])
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    generation_config=cfg)[0, len(ids):].tolist()
        replies.append(out)
        ids += out[:-1]  # a stop id is never fed (the next turn starts by closing the reply)
    return replies


def test_cli_chat_equals_transformers_greedy_continuation(bundle, hf_model, capsys, monkeypatch):
    """``kztts chat --greedy`` over three turns prints, turn by turn, what transformers' greedy search continues the
    same ChatML ids with (printed here: what the README shows)."""
    from kztts.cli.main import main
    from kztts.lm.lm import LM

    turns = ["Hi! Who are you?", "Bonjour, ça va ?", "你好，今天天气怎么样？"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(turns) + "\n"))
    assert main(["chat", str(bundle), "--greedy", "--max-new-tokens", "12", "--system", "Be brief."]) == 0
    printed = capsys.readouterr().out
    lm = LM(bundle)
    want = _hf_chat(hf_model, lm, turns, 12, "Be brief.")
    texts = [lm.decode([t for t in r if t not in lm.stop_ids]) for r in want]
    print("kztts chat printed:\n" + printed + "transformers' replies: " + json.dumps(texts, ensure_ascii=False))
    assert printed == "".join(t + "\n" for t in texts)


def test_context_overflow_and_refusals(bundle, hybrid_dir, tmp_path, capsys):
    from kztts.cli.main import main
    from kztts.htp.placement import PlacementError, parse_placement
    from kztts.lm.lm import LM

    lm = LM(bundle, context=24)
    with pytest.raises(ContextOverflowError, match="context of 24 positions"):
        lm.generate("word " * 40, 4)
    split = parse_placement({"prefill": {"cpu_layers": [1]}, "decode": {"cpu_layers": []}}, "split.json", 4)
    with pytest.raises(PlacementError, match="no per-layer graphs and runs each phase whole"):
        LM(bundle, placement=split)
    out = str(tmp_path / "b")
    for flags, msg in ((["--segments", "--target", "simulator"], "has no per-layer graphs"),
                       (["--kv", "fp16"], "no fp16 cache variant"),
                       (["--target", "simulator", "--precision", "w8a16"], "not available for hybrid LMs"),
                       (["--weights", "int8"], "--weights int8: a hybrid LM's int8 CPU weights have no accuracy bound"),
                       (["--weights", "int4"], "logits cosine min -0.03 at int8, -0.25 at int4 against fp32")):
        assert main(["export", str(hybrid_dir), "-o", out, *flags]) == 2
        err = capsys.readouterr().err
        assert msg in err and len([ln for ln in err.splitlines() if "error" in ln]) == 1, err
    assert not (tmp_path / "b").exists()  # refused before anything is written


def test_without_static_graphs_the_plan_falls_back_or_refuses(hybrid_dir, small_target, bundle):
    """A hybrid bundle without --target graphs: a target placing the stack on the HTP runs it on the CPU (non-strict,
    the plan says why) or refuses in one line naming the graph (strict). ``--weights int8`` quantizes both CPU graphs."""
    import onnx

    from kztts.bundle.manifest import read_manifest
    from kztts.core.errors import BundleError
    from kztts.export.lm.hybrid import cached_hybrid_bundle
    from kztts.export.common.variants import cached_variant
    from kztts.lm.lm import LM

    cpu_only = cached_hybrid_bundle(hybrid_dir)
    lm = LM(cpu_only, target=small_target)
    assert lm.plan.runner == "hybrid-cpu" and "no 'hybrid_static_prefill' graph" in lm.plan.steps["talker_prefill"].reason
    with pytest.raises(BundleError, match="no static graph 'hybrid_static_prefill'"):
        LM(cpu_only, target=small_target, strict=True)
    int8 = cached_variant(bundle, weights="int8")
    m = read_manifest(int8)
    for name in ("hybrid_prefill", "hybrid_decode"):
        ops = {n.op_type for n in onnx.load(str(int8 / m.graphs[name].file), load_external_data=False).graph.node}
        assert m.graphs[name].precision == "int8" and "MatMulNBits" in ops, name
    assert len(list(LM(int8).generate(PROMPT, 4, greedy=True))) >= 1


def test_a_hybrid_gguf_is_refused_in_one_line(tmp_path):
    from kztts.export.lm.checkpoint import check_causal_lm

    path = empty_gguf(tmp_path / "hybrid.gguf", "qwen3next")
    with pytest.raises(KzttsError, match="no GGUF loader for its Gated DeltaNet tensors"):
        check_causal_lm(path)


@pytest.fixture(scope="module")
def sim(bundle):
    from kztts.htp.qnn import qnn_available, qnn_unavailable_reason

    if not qnn_available():
        pytest.skip(f"no QNN execution provider: {qnn_unavailable_reason()}")
    return bundle


def _router_margins(hf_model, ids: list[int]) -> np.ndarray:
    """Per position, the smallest gap between the top-k-th and the next router probability over the MoE layers
    (inf for a dense model)."""
    import torch

    with torch.no_grad():
        out = hf_model(torch.tensor([ids]), output_router_logits=True)
    logits = getattr(out, "router_logits", None)
    if not logits or getattr(hf_model.config, "num_experts", 0) == 0:
        return np.full(len(ids), np.inf)
    k = hf_model.config.num_experts_per_tok
    gaps = [np.diff(-np.sort(-torch.softmax(r.float(), -1).numpy(), -1)[:, k - 1:k + 1], axis=-1)[:, 0] * -1
            for r in logits]
    return np.min(np.stack(gaps), axis=0)


@pytest.mark.parametrize("placement", ["prefill-htp-decode-cpu", "all-htp"])
def test_htp_prefill_on_the_simulator(sim, small_target, hf_model, kind, placement, record_property):
    """The static graphs on the HTP simulator (strict: every node on QNN), teacher-forced against all-CPU over a
    prompt spanning two prefill chunks: the handover's CPU decode from the HTP prefill's states and KV within
    HTP_COS (top-1 equal), every step on the HTP within ALL_HTP_COS; a chat's second turn extends the cache."""
    from kztts.eval.lm_accuracy import SAMPLES
    from kztts.lm.lm import LM

    cpu = LM(sim)
    htp = LM(sim, target=small_target, placement=placement, strict=True, check_saturation=True)
    assert htp.plan.runner == ("hybrid-handover" if placement.startswith("prefill") else "hybrid-static")
    ids = cpu.encode(SAMPLES[2].text)[:44]  # French: a 28-token prompt (16 + 12), then 16 decode steps
    n = 28
    cpu._claim(object())
    htp._claim(object())
    ref = [cpu.feed(ids[:n])] + [cpu.feed([t]) for t in ids[n:]]
    got = [htp.feed(ids[:n])] + [htp.feed([t]) for t in ids[n:]]
    margins = _router_margins(hf_model, ids)[n - 1:]
    cos = np.array([cosine(a, b) for a, b in zip(got, ref)])
    top1 = float(np.mean([np.argmax(a) == np.argmax(b) for a, b in zip(got, ref)]))
    record_property("htp_logits_cosine_min", float(cos.min()))
    print(f"{kind} {placement}: logits cosine min {cos.min():.6f} over {len(cos)} positions, top-1 agreement "
          f"{top1:.3f}; smallest router top-k margin {margins.min():.4f}; guard flagged {htp.runner.guard.count} calls")
    assert htp.runner.guard.count == 0
    if placement == "all-htp":
        assert cos.min() >= ALL_HTP_COS[kind]
    else:
        assert cos.min() >= HTP_COS and top1 == 1.0
    session = htp.chat_session(system="")
    list(session.send("Hi", 3, greedy=True))
    list(session.send("Again", 3, greedy=True))
    assert len(session.replies) == 2 and htp.runner.position == len(htp.history)


def test_cost_counts_the_deltanet_states(bundle, small_target):
    """``kztts.htp.cost`` on the hybrid: per decoded token one static decode call; its DeltaNet state bytes (read and
    written whole, f32) and its attention KV bytes (f16, the static context) as the shapes give them."""
    from kztts.bundle.manifest import read_manifest
    from kztts.htp.cost import bundle_cost, format_cost
    from kztts.htp.targets import load_target

    cfg = read_manifest(bundle).talker
    report = bundle_cost(bundle, load_target(small_target))
    assert report["unit"] == "token"
    rows = {r["graph"]: r for r in report["graphs"]}
    assert list(rows) == ["hybrid_static_prefill", "hybrid_static_decode"]
    dec = rows["hybrid_static_decode"]
    states = 3 * (cfg["conv_dim"] * (cfg["conv_kernel"] - 1) + cfg["linear_num_value_heads"]
                  * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"]) * 4
    C = load_target(small_target).shapes.context
    kv = 2 * cfg["num_kv_heads"] * cfg["head_dim"] * (C - 1) * 2
    assert dec["state_read_bytes"] == dec["state_write_bytes"] == states
    assert dec["kv_read_bytes"] == states + kv and dec["calls_per_frame"] == 1
    assert "DeltaNet states" in format_cost(report)


def test_calibrate_and_guard_cover_the_deltanet_layers(tmp_path, small_target, capsys):
    """A tiny hybrid whose layer-1 DeltaNet conv taps of the value channels are scaled by 5e3: its conv output reaches
    1.7e4 (prefill) / 1.1e4 (decode) (fp16 holds it, the guard's 8188 does not) and its recurrent state 8.1e3 / 5.3e3
    (the other DeltaNet layers' ~2), while its input projections and the residual stream stay small (the gated
    output norm rescales). ``kztts calibrate`` records both DeltaNet probes, flags layer 1 on its conv output and puts
    both phases on the CPU; on the simulator, strict, the guard stops the HTP run naming that layer and probe; the
    calibrated placement runs on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    from kztts.cli.main import main
    from kztts.export.lm.hybrid import export_hybrid_bundle
    from kztts.export.lm.hybrid_tiny import cached_tiny_hybrid
    from kztts.htp.qnn import qnn_available
    from kztts.htp.saturation import SaturationError
    from kztts.lm.lm import LM

    src = cached_tiny_hybrid("qwen3_next")
    model = AutoModelForCausalLM.from_pretrained(str(src)).eval()
    lin = model.model.layers[1].linear_attn
    with torch.no_grad():  # conv channels: [q | k | v]
        lin.conv1d.weight[2 * lin.key_dim:] *= 5e3
    big = tmp_path / "massive-conv"
    model.save_pretrained(big)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (src / f).is_file():
            (big / f).write_bytes((src / f).read_bytes())
    bundle = export_hybrid_bundle(big, tmp_path / "b", target=str(small_target))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello, how are you?\nBonjour !\n")
    assert main(["calibrate", str(bundle), "-o", str(tmp_path / "guarded.json"), "--prompts", str(prompts),
                 "--frames", "4"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "guarded.report.json").read_text())
    for phase in ("prefill", "decode"):
        rows = report["phases"][phase]["layers"]
        assert report["flagged"][phase] == [1] and rows[1]["peak_tensor"] == "conv_out", rows[1]
        states = [r["max_abs"].get("recurrent_state") for r in rows]
        print(phase, "layer 1 conv_out", rows[1]["max_abs"]["conv_out"], "recurrent_state per layer:", states)
        assert states[2] is None and states[1] > 100 * max(states[0], states[3])
    assert "conv_out" in printed
    placement = json.loads((tmp_path / "guarded.json").read_text())
    assert set(placement["prefill"]["layers"]) == set(placement["decode"]["layers"]) == {"cpu"}
    lm = LM(bundle, placement=str(tmp_path / "guarded.json"), target=str(small_target))
    assert lm.plan.runner == "hybrid-cpu"
    if qnn_available():
        htp = LM(bundle, target=str(small_target), placement="all-htp", strict=True)
        with pytest.raises(SaturationError, match="layer 1, conv_out"):
            list(htp.generate(PROMPT, 2))
