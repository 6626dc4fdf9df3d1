"""One copy of the Talker's weights on the HTP (tiny model, the simulator target at context 64, chunk 16).

QNN's weight sharing (prompt and token graphs in one context binary, ``ep.share_ep_contexts``) is
what device targets ship; the x86 simulator of onnxruntime-qnn 2.7.0 dies loading such a binary
(shown here in a child process). The simulator target therefore ships ``talker_graphs:
prefill-only``: decode steps run as padded prefill chunks (``kztts.runners.talker_prefill_only``).
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def _with(target: Path, tmp_path: Path, name: str, placement: dict | None = None, **changes) -> Path:
    data = json.loads(Path(target).read_text())
    data.update(changes)
    data["placement"].update(placement or {})
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(data))
    return out


def test_talker_graphs_is_a_checked_target_key(tmp_path):
    from kztts.htp.targets import TargetError, load_target

    assert load_target("simulator").talker_graphs == "prefill-only"  # it cannot load a weight-shared context
    assert load_target("x_elite").talker_graphs == "prefill+decode"  # devices share weights in one context
    bad = _with(load_target("simulator").path, tmp_path, "bad", talker_graphs="decode-only")
    with pytest.raises(TargetError, match=r"bad.json: talker_graphs: 'decode-only' is not one of prefill\+decode, "
                                          "prefill-only"):
        load_target(bad)


def test_prefill_only_runner_equals_prefill_and_decode_on_the_cpu(htp_bundle):
    """Decode steps through the padded prefill graph give the AR-1 graph's logits (CPU EP, fp32), up to
    the last usable position C - 1: the window that re-runs positions past C - S is exercised."""
    import onnxruntime as ort

    from kztts.bundle.bundle import Bundle
    from kztts.runners.talker_prefill_only import PrefillOnlyTalker
    from kztts.runners.talker_static import StaticTalker

    b = Bundle.open(htp_bundle, load_graphs=False)
    m = b.manifest

    def cpu(name):
        return ort.InferenceSession(str(b.path / m.graphs[name].file), providers=["CPUExecutionProvider"])

    prefill = cpu("talker_prefill")
    both, only = StaticTalker(prefill, cpu("talker_decode"), m.talker), PrefillOnlyTalker(prefill, m.talker)
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((21, both.hidden_size)).astype(np.float32)
    pairs = [(both.prefill(prompt), only.prefill(prompt))]
    for e in rng.standard_normal((both.context - 21, both.hidden_size)).astype(np.float32):
        pairs.append((both.decode(e), only.decode(e)))
    assert only.length == both.length == both.context  # every usable position
    assert only.graph_context - only.chunk < only.length  # the window past C - S ran
    # fp16 KV (the fp16 graphs' default): the window re-runs positions from their inputs, the AR-1 graph reads
    # them back from the fp16 cache, so the two differ by fp16 rounding (relative eps 4.9e-4; measured up to
    # 2.2e-3 on logits of ~19): the bound is relative to the values' scale there
    rel = 1e-4 if both.kv_dtype == np.float32 else 1e-3
    for (la, ha), (lb, hb) in pairs:
        assert np.abs(la - lb).max() < rel * max(1.0, np.abs(la).max())
        assert np.abs(ha - hb).max() < rel * max(1.0, np.abs(ha).max())
        assert la.argmax() == lb.argmax()


_CODES = r"""
import sys, json, numpy as np
from dataclasses import replace
from kztts import TTS, Voice
from kztts.eval.replay import decode_inputs, teacher_forced_talker
bundle, frames = sys.argv[1], int(sys.argv[2])
text = "Hello there, how are you today?"
out, first = {}, None
for target in sys.argv[3:]:
    tts = TTS(bundle, target=target, strict=True)
    voice = Voice(np.ones(tts.speaker_size, np.float32))
    settings = replace(tts.default_settings().greedy(), max_frames=frames, min_new_tokens=frames)
    codes = tts.generate_codes(text, voice, greedy=True, settings=settings)
    talker = [g for g, _ in tts.plan._sessions if g.startswith("talker")]
    out[target] = {"codes": np.asarray(codes).tolist(), "decode": list(tts.plan.steps["talker_decode"].graphs),
                   "talker_sessions": sorted(talker)}
    # teacher-forced on the first target's codes: logits against its, and its greedy CB0 margins over the
    # ids CB0 may take (codec ids below 2048, and end of speech)
    p = tts.prompt(text, voice)
    ref_codes = codes if first is None else first[0]
    logits, _ = teacher_forced_talker(tts.talker, p.embeds, decode_inputs(tts.tables, p, ref_codes[:-1]))
    if first is None:
        first = (codes, logits)
        continue
    ref = first[1]
    cos = (logits * ref).sum(1) / np.linalg.norm(logits, axis=1) / np.linalg.norm(ref, axis=1)
    eos = int(tts.bundle.manifest.special_ids["codec_eos"])
    allowed = np.concatenate([ref[:, :2048], ref[:, eos:eos + 1]], axis=1)
    top2 = np.sort(allowed, axis=1)[:, -2:]
    out[target].update(tf_cos_min=float(cos.min()), tf_max_diff=float(np.abs(logits - ref).max()),
                       tf_margins=(top2[:, 1] - top2[:, 0]).tolist())
print(json.dumps(out))
"""


def test_prefill_only_on_the_simulator_gives_the_same_codes(htp_bundle, small_target, tmp_path):
    """The HTP (simulator, strict, fp16): decode steps through the one Talker graph give the two graphs'
    logits, teacher-forced on the two graphs' greedy codes, to fp16 rounding; the greedy codes are equal
    until a CB0 choice whose margin is within that rounding (an fp16 near-tie of the random tiny model:
    measured after 2 frames, a gap of 0.03 between allowed ids with logits differing by up to 0.031).
    One Talker session is opened (the Code Predictor on the CPU: only the Talker is compared)."""
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    cpu = {"cp_frame": "cpu", "decoder": "cpu"}
    two = _with(small_target, tmp_path, "two", cpu)
    only = _with(small_target, tmp_path, "only", cpu, talker_graphs="prefill-only")
    res = subprocess.run([sys.executable, "-c", _CODES, str(htp_bundle), "10", str(two), str(only)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    two, one = out[str(two)], out[str(only)]
    assert two["decode"] == ["talker_decode"] and two["talker_sessions"] == ["talker_decode", "talker_prefill"]
    assert one["decode"] == ["talker_prefill"] and one["talker_sessions"] == ["talker_prefill"]
    assert len(one["codes"]) == 10
    # teacher-forced: measured cosine min 0.9999998, max |diff| 0.031 (one fp16 step at logits of 16-32)
    assert one["tf_cos_min"] >= 0.99999 and one["tf_max_diff"] <= 0.0625, one
    differ = [f for f in range(10) if one["codes"][f] != two["codes"][f]]
    if differ:  # the first different frame was decided by a near-tie within the runners' rounding
        f = differ[0]
        assert f >= 1 and one["codes"][:f] == two["codes"][:f]
        assert one["tf_margins"][f] <= 2 * one["tf_max_diff"], (f, one["tf_margins"][f], one["tf_max_diff"])


_LOAD_SHARED = r"""
import sys
from kztts.htp.qnn import create_session
from kztts.htp.targets import load_target
create_session(sys.argv[1], load_target(sys.argv[2]), strict=True, context={"ep.share_ep_contexts": "1"})
print("loaded")
"""


def _fp16_weight_bytes(path: Path) -> int:
    import onnx

    m = onnx.load(str(path))
    return 2 * sum(int(np.prod(t.dims)) for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)


def _bin_bytes(work: Path, made: dict) -> int:
    return sum((work / b).stat().st_size for b in {b for d in made.values() for b in d["binaries"]})


_MAKE = r"""
import json, sys
from pathlib import Path
from kztts.export.htp.static_graphs import make_context_binaries
from kztts.htp.targets import load_target
work, target, mode = Path(sys.argv[1]), load_target(sys.argv[2]), sys.argv[3]
names = sys.argv[4:]
if mode == "separate":
    made = {}
    for n in names:
        made.update(make_context_binaries(work, {n: f"graphs/{n}.onnx"}, target))
else:
    made = make_context_binaries(work, {n: f"graphs/{n}.onnx" for n in names}, target, share=mode == "shared")
print(json.dumps(made))
"""


def test_weight_shared_context_crashes_the_simulator_and_prefill_only_keeps_one_copy(htp_bundle, small_target,
                                                                                     tmp_path):
    """The EPContext weight-sharing recipe ONNX Runtime documents (``ep.share_ep_contexts`` while generating,
    ``ep.stop_share_ep_contexts`` on the last graph, embed mode 0, one ``.bin``) makes one binary for both
    graphs; loading it on the x86 simulator kills the process with SIGSEGV (a call through a null pointer in
    libQnnHtp.so under ``QnnBackendManager::CreateContextHandleFromBinary``). The prefill-only fallback's
    one context holds one weight copy: less than the shared binary, about half of two separate ones."""
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    names = ("talker_prefill", "talker_decode")
    sizes = {}
    for mode, graphs in (("shared", names), ("separate", names), ("prefill-only", names[:1])):
        work = tmp_path / mode
        (work / "graphs").mkdir(parents=True)
        for n in graphs:
            shutil.copy(htp_bundle / "graphs" / f"{n}.onnx", work / "graphs")
        shutil.copy(htp_bundle / "graphs" / "weights.data", work / "graphs")  # the tensors the graphs read
        made = subprocess.run([sys.executable, "-c", _MAKE, str(work), str(small_target), mode, *graphs],
                              capture_output=True, text=True, timeout=600)
        assert made.returncode == 0, made.stderr[-3000:]
        made = json.loads(made.stdout.strip().splitlines()[-1])
        sizes[mode] = _bin_bytes(work, made)
        if mode == "shared":
            assert len({b for d in made.values() for b in d["binaries"]}) == 1 and made["talker_decode"]["shared"]
            load = subprocess.run([sys.executable, "-c", _LOAD_SHARED, str(work / made["talker_prefill"]["file"]),
                                   str(small_target)], capture_output=True, text=True, timeout=600)
            assert load.returncode != 0, ("the simulator now loads weight-shared context binaries: drop "
                                          "simulator.json's prefill-only and kztts.htp.qnn's x86 fallback")
            assert load.returncode == -signal.SIGSEGV, (load.returncode, load.stderr[-2000:])
    weights = _fp16_weight_bytes(htp_bundle / "graphs" / "talker_prefill.onnx")
    print(f"\ncontext binary bytes: shared {sizes['shared']}, separate {sizes['separate']}, prefill-only "
          f"{sizes['prefill-only']}; one fp16 weight copy {weights} (prefill-only / weights "
          f"{sizes['prefill-only'] / weights:.2f})")
    assert sizes["prefill-only"] < sizes["shared"] < sizes["separate"]
    # measured on the tiny Talker: 692 KB, 762 KB, 1372 KB for 541 KB of fp16 weights (its graph overhead is a
    # large share at this size; the 0.6B figure is in qnn_configs/README.md)
    assert sizes["prefill-only"] < 0.55 * sizes["separate"] and sizes["prefill-only"] < 1.4 * weights
