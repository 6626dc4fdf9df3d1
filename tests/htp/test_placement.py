"""The precision guard: layer segments, calibration, placements (CPU parts here, HTP parts on the simulator).

The test model has a ~1e5 activation injected into Talker layer 1 (``make-tiny
--massive-layer 1``, ``kztts.export.tts.massive``): fp16 cannot hold it, fp32 can.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kztts.core.errors import KzttsError
from kztts.htp.placement import PlacementError, builtin, parse_placement
from kztts.plan.resolve import resolve_placement

from support import MASSIVE_LAYER

@pytest.fixture(scope="module")
def report(massive_bundle):
    from kztts.eval.calibrate import calibrate

    return calibrate(massive_bundle, frames=12)


@pytest.fixture(scope="module")
def guarded_file(report, tmp_path_factory):
    from kztts.htp.placement import write_placement

    return write_placement(report.placement(), tmp_path_factory.mktemp("placement") / "guarded.json")


@pytest.fixture(scope="module")
def massive_reference(massive_model):
    from kztts.export.common.checkpoint import load_reference

    return load_reference(massive_model)


# ------------------------------------------------------------------ placement files
def _bad(data, n=4):
    with pytest.raises(PlacementError) as e:
        parse_placement(data, "p.json", n)
    return str(e.value)


def test_placement_files_reject_unknown_layers_devices_and_keys():
    assert "p.json: talker.cpu_layers: unknown layer 4" in _bad({"talker": {"cpu_layers": [4]}})
    assert "unknown layer -1" in _bad({"talker": {"cpu_layers": [-1]}})
    assert 'p.json: prefill.layers[2]: unknown device or precision "gpu"' in _bad(
        {"prefill": {"layers": ["htp", "cpu", "gpu", "htp"]}, "decode": {"cpu_layers": []}})
    assert "talker.head: unknown device" in _bad({"talker": {"cpu_layers": [], "head": "npu"}})
    assert "the Talker has 4 layers, the list has 3" in _bad({"talker": {"layers": ["htp"] * 3}})
    assert "p.json: decode: missing" in _bad({"prefill": {"cpu_layers": []}})
    assert "p.json: bogus: unknown key" in _bad({"talker": {"cpu_layers": []}, "bogus": 1})
    assert "talker.cpu: unknown key" in _bad({"talker": {"cpu": [1]}})
    assert "unknown mode" in _bad({"mode": "half-htp", "talker": {"cpu_layers": []}})
    assert "for a 28-layer Talker, this model has 4" in _bad({"num_layers": 28, "talker": {"cpu_layers": []}})
    assert "exactly one of 'layers'" in _bad({"talker": {"head": "cpu"}})


def test_resolve_placement_errors_name_the_file(tmp_path):
    with pytest.raises(PlacementError, match="not a mode"):
        resolve_placement(tmp_path / "missing.json", 4)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlacementError, match=f"{bad}: not a readable JSON"):
        resolve_placement(bad, 4)
    with pytest.raises(PlacementError, match="needs a file"):
        resolve_placement("guarded", 4)


def test_explicit_placement_from_a_qnn_configs_target(tmp_path):
    from kztts.htp.targets import TargetError, configs_dir, load_target

    data = json.loads((configs_dir() / "simulator.json").read_text())
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(data))
    with pytest.raises(PlacementError, match="no 'layer_placement'"):
        resolve_placement(plain, 4)
    data["layer_placement"] = {"prefill": {"cpu_layers": [0, 3]}, "decode": {"layers": ["cpu", "htp", "htp", "htp"],
                                                                             "head": "cpu"}}
    good = tmp_path / "good.json"
    good.write_text(json.dumps(data))
    p = resolve_placement(good, 4)
    assert p.mode == "explicit" and p.prefill.layers == ("cpu", "htp", "htp", "cpu") and p.decode.head == "cpu"
    with pytest.raises(PlacementError, match="layer_placement.prefill.cpu_layers: unknown layer 3"):
        resolve_placement(good, 3)
    data["layer_placement"] = {"talker": {"layers": ["cpu", "dsp"]}}
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(data))
    with pytest.raises(TargetError, match=r"layer_placement.talker.layers\[1\]: unknown device or precision \"dsp\""):
        load_target(worse)


def test_segments_join_adjacent_units_on_one_device():
    p = parse_placement({"talker": {"cpu_layers": [1, 2]}}, "p.json", 5)
    segs = p.segments("decode")
    assert [(s.device, s.start, s.stop, s.head) for s in segs] == [
        ("htp", 0, 1, False), ("cpu", 1, 3, False), ("htp", 3, 5, True)]
    assert [s.label for s in segs] == ["layer 0", "layers 1-2", "layers 3-4 + head"]
    p = parse_placement({"talker": {"cpu_layers": [4], "head": "htp"}}, "p.json", 5)
    assert [s.label for s in p.segments("prefill")][-2:] == ["layer 4", "head"]
    assert builtin("prefill-htp-decode-cpu", 3).uniform("prefill") == "htp"
    assert builtin("prefill-htp-decode-cpu", 3).uniform("decode") == "cpu"
    assert builtin("prefill-htp-decode-cpu", 3).uniform() is None


# ------------------------------------------------------------------ the injected model and its graphs
def test_injected_activation_lives_inside_one_layer_of_the_reference(massive_reference):
    """In the official model, layer 1's residual stream reaches ~1e5 (``kztts.export.tts.massive``'s value); its input
    and output do not."""
    import torch

    from kztts.export.tts.massive import DEFAULT_VALUE

    talker = massive_reference.model.talker
    mids, outs = {}, {}

    def hook(i):
        def f(mod, args, kwargs, out):
            mids[i] = float(kwargs.get("hidden_states", args[0] if args else None).abs().max())
            outs[i] = float((out[0] if isinstance(out, tuple) else out).abs().max())
        return f

    handles = [lay.register_forward_hook(hook(i), with_kwargs=True) for i, lay in enumerate(talker.model.layers)]
    handles.append(talker.model.layers[MASSIVE_LAYER].post_attention_layernorm.register_forward_hook(
        lambda m, a, o: mids.__setitem__("post_norm_in", float(a[0].abs().max()))))
    try:
        x = torch.randn(1, 9, talker.config.hidden_size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            talker.model(inputs_embeds=x, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    assert 0.9 * DEFAULT_VALUE < mids["post_norm_in"] < 1.1 * DEFAULT_VALUE  # the residual stream inside layer 1
    assert max(outs.values()) < 1e3 and max(v for k, v in mids.items() if k != "post_norm_in") < 1e3


def test_segment_graphs_on_the_cpu_equal_the_talker_graph(massive_bundle):
    from kztts.bundle.bundle import Bundle
    from kztts.core.metrics import cosine_rows
    from kztts.eval.replay import teacher_forced_talker as replay
    from kztts.export.validate.htp import bundle_sequences
    from kztts.plan.resolve import resolve_plan
    from kztts.runners.talker import Talker

    seqs = bundle_sequences(massive_bundle, frames=10)
    b = Bundle.open(massive_bundle)
    dyn = Talker(b.session("talker"), b.manifest.talker, context=64)
    seg = resolve_plan(b, placement=builtin("all-cpu", 4), segments=True).open_talker()
    for s in seqs:
        assert s["prefill"].shape[0] > 16  # two prefill chunks
        dl, dh = replay(dyn, s["prefill"], s["decodes"])
        sl, sh = replay(seg, s["prefill"], s["decodes"])
        assert cosine_rows(sl, dl).min() > 0.999999 and (sl.argmax(-1) == dl.argmax(-1)).all()
        assert np.abs(sh - dh).max() < 1e-3


def test_static_attention_masks_whatever_the_scores_scale():
    """The static graphs' finite additive mask (-50, the target's ``attention_mask_value``) hides masked
    slots even when the attention scores are thousands (Qwen2.5's large q/k biases: layer 0's scores reach
    1.3e4 on the 1.5B): a Qwen2 layer with such biases, with junk keys in the masked cache slots and a padded
    row, gives through the layer graph's module and the static stack what the dynamic stack (-inf causal
    mask, only the valid cache) gives. A plain ``scores + mask`` let the masked slots take the softmax
    (the 1.5B's layer graphs ran 7% low from layer 1 on)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from kztts.export.common.qwen3_stack import Qwen3Stack, rope_cos_sin
    from kztts.export.graphs.segment_graphs import LayerStaticGraph
    from kztts.export.graphs.talker_graph import talker_shape
    from kztts.runners.talker_static import chunk_inputs

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    layer = model.model.layers[0]
    with torch.no_grad():  # valid scores near -2.5e3: far below a masked slot's 0 + (-50)
        layer.self_attn.q_proj.bias.fill_(25.0)
        layer.self_attn.k_proj.bias.fill_(-25.0)
    s = talker_shape(model)
    kv, hd, S, C, filled, n = s.num_kv_heads, s.head_dim, 4, 16, 5, 3
    P = C - S
    x, mask = chunk_inputs(np.random.default_rng(0).normal(size=(n, s.hidden)).astype(np.float32), n, S, filled, C,
                           s.hidden, -50.0)
    x, mask = torch.from_numpy(x), torch.from_numpy(mask)
    cos, sin = rope_cos_sin(torch.arange(filled, filled + S), hd, s.rope_theta)
    past_k = torch.randn(1, kv, hd, P) * 30  # junk past the filled slots (a previous prompt's keys, zeros, ...)
    past_v = torch.randn(1, kv, P, hd)
    stack = Qwen3Stack(torch.nn.ModuleList([layer]), torch.nn.Identity(), num_heads=s.num_heads,
                       num_kv_heads=kv, head_dim=hd)
    with torch.no_grad():
        want, _, _ = stack(x[:, :n], cos[:, :n], sin[:, :n], [past_k[..., :filled].transpose(2, 3)],
                           [past_v[:, :, :filled]])
        graph = LayerStaticGraph(layer, s, S, C).eval()
        got, _, _, stats = graph(x, mask, cos, sin, past_k.reshape(kv, 1, hd, P), past_v.reshape(kv, 1, P, hd))
        whole, _, _ = stack(x, cos, sin, [past_k], [past_v], mask=mask.reshape(1, 1, 1, S, C), keys_transposed=True)
    assert stats[3] > 2e3  # the attention scores' magnitude
    scale = float(want.abs().max())
    for out in (got, whole):
        assert float((out[:, :n] - want).abs().max()) < 1e-5 * scale


def test_calibration_flags_exactly_the_injected_layer(report):
    for phase in ("prefill", "decode"):
        assert report.flagged(phase) == [MASSIVE_LAYER]
        assert not report.head_flagged(phase)
        assert report.layers[phase][MASSIVE_LAYER].max() > 9e4
        others = np.delete(report.layers[phase], MASSIVE_LAYER, axis=0)
        assert 1.0 < others.max() < 1e3  # the other layers were measured, and are ordinary
        assert report.positions[phase] > 0
    p = report.placement()
    assert p.mode == "guarded" and p.cpu_layers("prefill") == p.cpu_layers("decode") == [MASSIVE_LAYER]
    doc = report.to_json()
    row = doc["phases"]["decode"]["layers"][MASSIVE_LAYER]
    assert row["flagged"] and row["peak_tensor"] in ("attn_out", "residual_mid", "mlp_out")
    assert len(report.prompts) >= 6  # the shipped multilingual set fits the test context


def test_calibrate_cli_writes_placement_report_and_plot(massive_bundle, tmp_path):
    out = tmp_path / "guard.json"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two prompts\nHello there, how are you?\n\nBonjour tout le monde.\n")
    proc = subprocess.run([sys.executable, "-m", "kztts.cli.main", "calibrate", str(massive_bundle), "--prompts",
                           str(prompts), "--frames", "6", "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "2 prompts" in proc.stdout and "layer 1 on cpu" in proc.stdout
    placement = resolve_placement(out, 4)
    assert placement.mode == "guarded" and placement.cpu_layers("decode") == [MASSIVE_LAYER]
    rep = json.loads((tmp_path / "guard.report.json").read_text())
    assert rep["flagged"] == {"prefill": [MASSIVE_LAYER], "decode": [MASSIVE_LAYER]}
    png = tmp_path / "guard.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibrate_refuses_bad_prompts_and_bundles(massive_bundle, tmp_path):
    from kztts.eval.calibrate import calibrate, load_prompts

    bad = tmp_path / "p.json"
    bad.write_text(json.dumps([{"text": "hi", "lang": "en"}]))
    with pytest.raises(KzttsError, match="prompt 0: unknown keys"):
        load_prompts(bad)
    bad.write_text("[]")
    with pytest.raises(KzttsError, match="no prompts"):
        load_prompts(bad)
    with pytest.raises(KzttsError, match="threshold must be positive"):
        calibrate(massive_bundle, threshold=0)


def test_calibrate_needs_layer_segments(tiny_bundle_dir):
    from kztts.eval.calibrate import calibrate

    with pytest.raises(KzttsError, match="--segments"):
        calibrate(tiny_bundle_dir)


# ------------------------------------------------------------------ on the HTP simulator
def test_all_htp_is_measurably_wrong_on_the_injected_model(qnn, massive_bundle, massive_model, massive_reference,
                                                           talker_only_target):
    from kztts.export.validate.placement import validate_placement

    r = validate_placement(massive_bundle, massive_model, "all-htp", talker_only_target, frames=8,
                           tts=massive_reference)
    assert r["runner"] == "StaticTalker"
    assert r["talker_logits_cos_min"] < 0.9 and r["talker_argmax_match"] < 0.5
    assert r["greedy_codes_match"] < 0.5


def test_guarded_placement_restores_fp32_accuracy(qnn, massive_bundle, massive_model, massive_reference,
                                                  talker_only_target, guarded_file):
    from kztts.export.validate.placement import validate_placement

    r = validate_placement(massive_bundle, massive_model, guarded_file, talker_only_target, frames=24,
                           tts=massive_reference)
    assert r["runner"] == "SegmentedTalker" and r["placement"]["mode"] == "guarded"
    assert r["talker_logits_cos_min"] >= 0.999
    # Teacher-forced, every CB0 decision equals fp32. Free-running, the fp16 layers move the hidden
    # state by ~1e-4 and a near-tie of the random Code Predictor (on the CPU on both sides) may flip
    # a code and with it every later frame (tiny CP at head_dim 16: text 1 after 12 frames);
    # all-htp gets 0 frames.
    assert r["talker_argmax_match"] == 1.0
    assert min(r["greedy_frames_equal"]) >= 8 and r["greedy_codes_match"] >= 0.75, r["greedy_frames_equal"]
    assert [(s["phase"], s["device"], s["layers"]) for s in r["segments"]] == [
        (ph, d, lab) for ph in ("prefill", "decode")
        for d, lab in (("htp", "layer 0"), ("cpu", "layer 1"), ("htp", "layers 2-3 + head"))]
    assert all(s["hidden_cos_min"] >= 0.999 for s in r["segments"])
    assert r["cpu_layer_fraction"] == {"prefill": 0.25, "decode": 0.25}
    for name, g in r["graphs"].items():  # strict: every node of the HTP segments ran on QNN
        if "layer_1" not in name:
            assert g["cpu_nodes"] == 0, name


def test_prefill_htp_decode_cpu_hands_over_the_htp_kv(qnn, small_target):
    from kztts.bundle.bundle import Bundle
    from kztts.core.audio import synthetic_voice
    from kztts.export.tts.bundle_writer import cached_target_bundle
    from kztts.export.tts.tiny import cached_tiny
    from kztts.plan.resolve import resolve_plan
    from kztts.runners.talker import Talker
    from kztts.runners.talker_handover import HandoverTalker
    from kztts.tts.tts import TTS

    bundle = Bundle.open(cached_target_bundle(cached_tiny("proj"), small_target))
    text = "Hello world, this is a tiny test."
    cpu = TTS(bundle)
    voice = cpu.voice_from_wav(synthetic_voice(), 24000)
    want = cpu.generate_codes(text, voice, language="english", greedy=True, max_frames=30)
    htp = TTS(bundle, target=small_target, placement="prefill-htp-decode-cpu", strict=True)
    assert isinstance(htp.talker, HandoverTalker)
    htp.talker.keep_handover = True
    got = htp.generate_codes(text, voice, language="english", greedy=True, max_frames=30)
    assert got.shape == want.shape == (30, 16) and (got == want).all()

    # the KV the CPU decoded from is the HTP prefill's own, not a CPU recomputation
    prompt = cpu.prompt(text, voice, language="english").embeds
    ref = resolve_plan(bundle, target=small_target, placement="all-htp", strict=True).open_talker()
    ref.prefill(prompt)
    cpu_talker = Talker(bundle.session("talker"), bundle.manifest.talker, context=64)
    cpu_talker.prefill(prompt)
    p = prompt.shape[0]
    assert htp.talker.decode_talker.position >= p
    for i, (k, v) in enumerate(htp.talker.handed_over):
        assert k.shape == (1, ref.keys[i].shape[0], p, ref.keys[i].shape[2])
        assert np.array_equal(k, ref.keys[i][..., :p].transpose(1, 0, 3, 2))
        assert np.array_equal(v, ref.values[i][:, :, :p].transpose(1, 0, 2, 3))
        ck, cv = cpu_talker.kv.past(i)
        assert 0 < np.abs(k - ck).max() < 0.05 and 0 < np.abs(v - cv).max() < 0.05  # fp16, not fp32


def test_validate_placement_cli_rejects_a_bad_file(massive_bundle, massive_model, tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"talker": {"cpu_layers": [7]}}))
    proc = subprocess.run([sys.executable, "-m", "kztts.cli.main", "validate", str(massive_bundle), "--reference",
                           str(massive_model), "--placement", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"{bad}: talker.cpu_layers: unknown layer 7: the Talker has layers 0..3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_synth_cli_with_a_guarded_placement(qnn, massive_bundle, talker_only_target, guarded_file, tmp_path):
    """``kztts synth --placement``: the guarded run speaks the fp32 codes; all-htp does not, and says so
    (the run-time saturation guard; under --strict it refuses, tests/htp/test_saturation.py)."""
    from kztts.core.audio import synthetic_voice, write_wav

    target = talker_only_target
    voice = write_wav(tmp_path / "voice.wav", synthetic_voice(), 24000)

    def synth(*extra):
        codes = tmp_path / f"codes{len(list(tmp_path.iterdir()))}.npy"
        proc = subprocess.run([sys.executable, "-m", "kztts.cli.main", "synth", "Hello world, this is a test.",
                               "--bundle", str(massive_bundle), "--speaker-wav", str(voice), "-o",
                               str(tmp_path / "out.wav"), "--greedy", "--max-frames", "12", "--codes-out", str(codes),
                               *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        synth.out = proc.stdout + proc.stderr
        return np.load(codes)

    cpu = synth()
    guarded = synth("--target", str(target), "--placement", str(guarded_file), "--strict")
    assert guarded.shape == cpu.shape == (12, 16) and (guarded == cpu).all()
    assert "fp16 saturation" not in synth.out
    all_htp = synth("--target", str(target), "--placement", "all-htp")
    assert (all_htp[:, 0] != cpu[:, 0]).mean() > 0.5
    assert synth.out.count("fp16 saturation on the HTP: Talker prefill layer 1,") == 1, synth.out
    assert "HTP graph calls reached the guard threshold" in synth.out


def test_validate_cli_all_htp_fails_beside_the_guarded_row_on_a_prefill_only_target(
        qnn, massive_bundle, massive_model, talker_only_target, guarded_file, tmp_path):
    """``kztts validate --target T --placement P`` under a ``talker_graphs: prefill-only`` target (the
    shipped simulator's; its static Talker has no decode session): all-htp runs and FAILS under the
    placement bounds (the injected activation saturates fp16: logits cosine near 0), the guarded
    placement PASSES, each in one command."""
    data = json.loads(talker_only_target.read_text())
    data["talker_graphs"] = "prefill-only"
    target = tmp_path / talker_only_target.name  # same name: the bundle's graphs were made for it
    target.write_text(json.dumps(data))

    def validate(placement) -> tuple[int, dict]:
        proc = subprocess.run([sys.executable, "-m", "kztts.cli", "validate", str(massive_bundle), "--reference",
                               str(massive_model), "--target", str(target), "--placement", str(placement),
                               "--frames", "8", "--json"], capture_output=True, text=True)
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        return proc.returncode, json.loads(proc.stdout)

    code, all_htp = validate("all-htp")
    assert code == 1 and not all_htp["pass"] and all_htp["runner"] == "PrefillOnlyTalker"
    assert all_htp["talker_logits_cos_min"] < 0.2, all_htp["talker_logits_cos_min"]
    assert set(all_htp["graphs"]) == {"talker_prefill"}  # decode steps run through the prefill graph
    code, guarded = validate(guarded_file)
    assert code == 0 and guarded["pass"] and guarded["talker_logits_cos_min"] >= 0.999, guarded
