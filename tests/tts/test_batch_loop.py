"""Continuous batching (``kztts.tts.batch_loop``): each request of a batch gets the codes and audio it gets
alone, greedy or sampled, whether it stops at EOS, at its ``max_frames``, or joins late.

On the tiny model with the EOS bias (``cached_tiny(eos_bias=True)``: greedy speech ends by EOS
after a few frames), one ``TTS`` for the module (opening one takes seconds)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kztts.core.errors import KzttsError
from kztts.tts.request import SynthesisRequest


@pytest.fixture(scope="module")
def eos_bundle():
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny("proj", eos_bias=True))


@pytest.fixture(scope="module")
def tts(eos_bundle):
    from kztts.tts.tts import TTS

    return TTS(eos_bundle)


@pytest.fixture(scope="module")
def requests(tts):
    """Four requests: different texts, languages, voices (x-vectors and an ICL voice), seeds, lengths;
    greedy and sampled (the Code Predictor with top-k and top-p, a repetition penalty)."""
    from kztts.core.audio import synthetic_voice
    from kztts.tts.request import Voice

    rng = np.random.default_rng(7)
    xv = [Voice(rng.standard_normal(tts.speaker_size).astype(np.float32)) for _ in range(2)]
    icl = tts.voice_from_reference(synthetic_voice(seconds=0.5), 24000, "A short reference.")
    s = tts.default_settings()
    sampled = replace(s, code_predictor=replace(s.code_predictor, top_k=20, top_p=0.9, repetition_penalty=1.1))
    return [SynthesisRequest("Hello there, how are you today?", xv[0], "english", seed=1, greedy=True, max_frames=30),
            SynthesisRequest("Bonjour tout le monde.", xv[1], "french", seed=2, settings=sampled, max_frames=30),
            SynthesisRequest("Short.", xv[0], None, seed=3, max_frames=4),  # cut by max_frames
            SynthesisRequest("你好，世界！这是一个测试。", icl, "chinese", seed=4, max_frames=30)]


@pytest.fixture(scope="module")
def alone(tts, requests):
    return [tts.synthesize(r.text, r.voice, language=r.language, seed=r.seed, greedy=r.greedy,
                           settings=r.settings, max_frames=r.max_frames) for r in requests]


def _same(a, b) -> None:
    assert a.codes.shape == b.codes.shape and np.array_equal(a.codes, b.codes)
    assert np.array_equal(a.samples, b.samples)
    assert a.stopped_by_eos == b.stopped_by_eos


@pytest.mark.parametrize("batch", [4, 2])  # 2: the third and fourth requests join when rows free up
def test_each_request_of_a_batch_equals_it_alone(tts, requests, alone, batch):
    many = tts.synthesize_many(requests, batch=batch)
    for a, m in zip(alone, many):
        _same(a, m)
    ends = [r.stopped_by_eos for r in alone]
    assert ends[2] is False and alone[2].frames == 4  # its max_frames, while the others run on
    assert sum(ends) >= 2 and len({r.frames for r in alone}) >= 3  # EOS at different frames
    assert len({r.codes[0, 0] for r in alone}) > 1 or len({r.codes[0, 1] for r in alone}) > 1


def test_stream_many_yields_each_request_s_stream(tts, requests, alone):
    chunks: dict[int, list] = {}
    results: dict = {}
    for index, chunk in tts.stream_many(requests, batch=3, chunk_frames=3, results=results):
        chunks.setdefault(index, []).append(chunk)
    for i, r in enumerate(requests):
        own = list(tts.stream(r.text, r.voice, language=r.language, seed=r.seed, greedy=r.greedy,
                              settings=r.settings, max_frames=r.max_frames, chunk_frames=3))
        assert len(own) == len(chunks[i]) and all(np.array_equal(x, y) for x, y in zip(own, chunks[i]))
        assert np.array_equal(results[i].codes, alone[i].codes)


def test_requests_are_checked_before_any_frame(tts, requests):
    with pytest.raises(KzttsError, match="batch must be an integer >= 1"):
        tts.synthesize_many(requests, batch=0)
    with pytest.raises(KzttsError, match="request 1: .*unexpected keyword argument 'speed'"):
        tts.synthesize_many([requests[0], {"text": "x", "voice": requests[0].voice, "speed": 2}])
    with pytest.raises(KzttsError, match="request 0 must be"):
        tts.synthesize_many(["just a text"])
    assert tts.synthesize_many([], batch=2) == []


def test_a_text_longer_than_the_context_is_refused(tts, requests, monkeypatch):
    monkeypatch.setattr(tts.talker.kv, "context", 40)  # one utterance no longer fits
    long = replace(requests[0], text="One sentence here. " * 12)
    with pytest.raises(KzttsError, match="request 1: its text needs more than the Talker's context of 40"):
        tts.synthesize_many([requests[2], long])


def test_batching_needs_the_fused_cpu_graphs(eos_bundle):
    from kztts.bundle.bundle import Bundle
    from kztts.plan.resolve import resolve_plan

    plan = resolve_plan(Bundle.open(eos_bundle, load_graphs=False), attention="plain")
    with pytest.raises(KzttsError, match="batched synthesis runs the fused CPU graphs, but this plan runs talker"):
        plan.open_batched(None, 2, 8)


def _cli(capsys, *args):
    from kztts.cli.main import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_synth_file_writes_a_wav_per_line_and_a_summary(tts, eos_bundle, tmp_path, capsys, monkeypatch):
    import kztts.cli.synth
    from kztts.core.audio import read_wav

    monkeypatch.setattr(kztts.cli.synth, "TTS", lambda bundle, **kw: tts)  # the module's opened TTS
    xv = tmp_path / "voice.npy"
    np.save(xv, np.random.default_rng(1).standard_normal(tts.speaker_size).astype(np.float32))
    lines = [{"text": "Hello there.", "language": "english", "seed": 5, "name": "hello"},
             {"text": "Bonjour.", "language": "french", "greedy": True, "max_frames": 3},
             {"text": "Third one.", "seed": 9, "cp_top_k": 5, "xvector": "voice.npy"}]
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    out = tmp_path / "out"
    code, stdout, err = _cli(capsys, "synth", "--bundle", eos_bundle, "--xvector", xv, "--file", jsonl,
                             "--out-dir", out, "--batch", 2)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert [i["wav"] for i in summary["items"]] == ["hello.wav", "0002.wav", "0003.wav"]
    assert summary["batch"] == 2 and summary["frames"] == sum(i["frames"] for i in summary["items"])
    alone = tts.synthesize("Bonjour.", tts.voice_from_xvector(xv), language="french", greedy=True, max_frames=3)
    wav, sr = read_wav(out / "0002.wav")
    assert sr == 24000 and wav.shape == alone.samples.shape and summary["items"][1]["frames"] == 3
    assert "3 WAVs" in stdout


@pytest.mark.parametrize("line, message", [
    ('{"text": "ok"}\nnot json', "line 2: not valid JSON"),
    ('{"text": "ok"}\n\n{"text": "x", "sed": 1}', "line 3: unknown key 'sed'"),
    ('{"text": "x", "seed": "one"}', "line 1: key 'seed' must be int"),
    ('{"language": "english"}', "line 1: key 'text' is missing"),
    ('{"text": "x", "cp_top_k": -2}', "line 1: key 'cp_top_k'"),
    ('{"text": "a", "name": "n"}\n{"text": "b", "name": "n"}', "line 2: key 'name' 'n' is already used by line 1"),
])
def test_a_bad_jsonl_line_names_its_number_and_key(tmp_path, capsys, line, message):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(line + "\n")
    code, _, err = _cli(capsys, "synth", "--bundle", tmp_path / "none", "--file", jsonl, "--out-dir", tmp_path / "o")
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_bench_batch_sizes_and_configurations():
    from kztts.bench.batch_rows import batch_tasks, parse_batches
    from kztts.bench.grid import Config

    assert parse_batches("4,1,2,4") == [1, 2, 4] and parse_batches(None) == []
    for bad in ("0", "x", "2,-1", ","):
        with pytest.raises(KzttsError, match="--batch"):
            parse_batches(bad)
    fused, plain, step = Config(), Config(attention="plain"), Config(cp_mode="step")
    assert batch_tasks([fused, plain, step], [1, 4]) == [("batch", (fused, 1)), ("batch", (fused, 4))]


@pytest.mark.slow
def test_bench_batch_rows(tmp_path):
    """``kztts bench --batch 1,2``: a row per batch size with throughput, the rows' codes as the fp32 baseline."""
    import subprocess
    import sys

    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "bench", "--size", "tiny", "--weights", "fp32",
                          "--kv", "fp32", "--cp-mode", "frame", "--threads", "1", "--frames", "6", "--warmup", "2",
                          "--no-reference", "--batch", "1,2", "--out", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    for b in (1, 2):
        r = rows[f"fp32/kv-fp32/cp-frame/dec-fp32/t1/batch{b}"]
        assert r["kind"] == "kztts-batch" and r["batch"] == b and r["streams_equal"] is True
        assert r["code_agreement"] == 1.0 and r["rows_max_diff"] == 0.0 and r["talker_cos_min"] > 0.99999
        assert r["fps"] > 0 and r["fps_talker_cp"] >= r["fps"] and r["ttfa_ms"] > 0 and r["peak_rss_mb"] > 0
        assert r["prefill_positions"] > 0 and 0 < r["talker_limit_pct"] and 0 < r["cp_limit_pct"]
    # the batched step reads the constants once: a second stream adds only its own KV
    one, two = (rows[f"fp32/kv-fp32/cp-frame/dec-fp32/t1/batch{b}"] for b in (1, 2))
    assert one["talker_read_mb"] < two["talker_read_mb"] < 1.5 * one["talker_read_mb"]
    assert "frames/s (all streams)" in (out / "results.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["-o", "x.wav"], "it does not take -o/--output"),
    (["--stream"], "it does not take --stream"),
    (["--batch", "0"], "--batch must be >= 1"),
])
def test_synth_file_refuses_single_output_flags(tmp_path, capsys, extra, message):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"text": "ok"}\n')
    code, _, err = _cli(capsys, "synth", "--bundle", tmp_path / "none", "--file", jsonl, "--out-dir", tmp_path / "o",
                        *extra)
    assert code == 2 and message in err, err
    code, _, err = _cli(capsys, "synth", "--bundle", tmp_path / "none")
    assert code == 2 and "synth needs TEXT and -o/--output (or --file" in err


def test_the_cpu_matmul_computes_each_row_alone():
    """The premise of the batch contract at real sizes (the tiny model's K of 64 cannot show it): ONNX
    Runtime's fp32 MatMul gives a row the same bits whatever rows share its run (K = 1024 here, 2
    threads). (Its int8/int4 MatMulNBits does not once K spans several 128-blocks: see DESIGN.md.)"""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k, n = 1024, 1536
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) * 0.03).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "row",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 1, n])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((8, 1, k)).astype(np.float32)
    alone = np.concatenate([session.run(None, {"x": x[i:i + 1]})[0] for i in range(8)])
    for b in (2, 3, 8):
        assert np.array_equal(session.run(None, {"x": x[:b]})[0], alone[:b]), b
