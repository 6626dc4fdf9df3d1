"""Continuous batching (``kztts.tts.batch_loop``): each request of a batch gets the codes and audio it gets
alone, greedy or sampled, whether it stops at EOS, at its ``max_frames``, or joins late.

On the tiny model with the EOS bias (``cached_tiny(eos_bias=True)``: greedy speech ends by EOS
after a few frames), one ``TTS`` for the module (opening one takes seconds)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kztts.core.errors import KzttsError
from kztts.tts.request import SynthesisRequest


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


def test_the_loop_its_rows_and_their_capacity(tts, requests, alone):
    """``BatchLoop`` directly, as a server drives it: runs join free rows (the KV capacity grows for one that needs
    more), leave when dropped, and each run's frames, reported under its key, are its codes alone."""
    from kztts.tts.batch_loop import BatchLoop, start_runs

    with pytest.raises(KzttsError, match="batch must be an integer >= 1, got 0"):
        BatchLoop(tts, 0, 8)
    loop = BatchLoop(tts, 2, 8)
    runs = start_runs(tts, requests[:3])
    assert (loop.rows, loop.free, loop.talker.capacity) == (2, 2, 8)
    loop.join("a", runs[0])
    loop.join("b", runs[1])
    assert loop.free == 0 and loop.talker.capacity > 8  # a prompt and its frames: the buffers grew
    with pytest.raises(KzttsError, match="all 2 batch rows are taken"):
        loop.join("c", runs[2])
    loop.leave({"b"})  # cancelled: its row is free at once
    assert loop.free == 1
    frames, ended = [], []
    while loop.active:
        for key, frame in loop.step():
            (frames if frame is not None else ended).append(key if frame is None else frame)
    assert ended == ["a"] and np.array_equal(np.stack(frames), alone[0].codes)
    assert np.array_equal(runs[0].code_array(), alone[0].codes) and loop.free == 2


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
