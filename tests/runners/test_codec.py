"""Speech-tokenizer graphs against qwen-tts: full decode, streaming decode, encoder (ICL ref codes).

The tiny "proj" and "equal" checkpoints share one speech tokenizer, so these run on "proj" only.
"""
from __future__ import annotations

import numpy as np
import pytest

from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError
from kztts.core.metrics import snr_db
from kztts.runners.codec import Decoder, Encoder, StreamingDecoder, check_codes

from support import ROOT

on_proj = pytest.mark.parametrize("variant", ["proj"], indirect=True)
FRAMES = 310  # crosses qwen-tts's 300-frame decode segment (left context 25)


@pytest.fixture(scope="module")
def codec_dir(reference, tmp_path_factory):
    """The codec graphs as ``export_decoder`` / ``export_encoder`` write them (default options): (folder, specs)."""
    from kztts.export.graphs.codec_graphs import export_decoder, export_encoder

    out = tmp_path_factory.mktemp("codec")
    specs = export_decoder(reference.model, out, "test")
    specs.update(export_encoder(reference.model, out, "test"))
    return out, specs


@pytest.fixture(scope="module")
def codec(codec_dir):
    from kztts.bundle.sessions import open_session

    out, specs = codec_dir
    return {name: (open_session(out, spec), spec) for name, spec in specs.items()}


@pytest.fixture(scope="module")
def codes():
    return np.random.default_rng(7).integers(0, 2048, (FRAMES, 16), dtype=np.int64)


@pytest.fixture(scope="module")
def reference_wav(reference, codes):
    """qwen-tts's own decode of ``codes`` (Qwen3TTSTokenizer.decode: clamp, chunked_decode(300, 25), trim)."""
    wavs, sr = reference.model.speech_tokenizer.decode([{"audio_codes": codes}])
    assert sr == 24000
    return wavs[0]


@pytest.fixture(scope="module")
def full_wav(codec, codes):
    return Decoder(codec["decoder"][0]).decode(codes)


@on_proj
def test_graph_io(codec):
    spec = codec["decoder"][1]
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [("codes", "int64", (1, "frames", 16))]
    assert [(t.name, t.dtype, t.shape) for t in spec.outputs] == [("wav", "float32", (1, "samples"))]
    stream = codec["decoder_stream"][1]
    assert [t.name for t in stream.inputs[:2]] == ["codes", "position"]
    for i, o in zip(stream.inputs[2:], stream.outputs[1:]):  # fixed-size state, same order in and out
        assert o.name == "new_" + i.name and o.shape == i.shape and all(isinstance(d, int) for d in i.shape)
    enc = codec["encoder"][1]
    assert [(t.name, t.dtype, t.shape) for t in enc.inputs] == [("wav", "float32", (1, "samples"))]
    assert [(t.name, t.dtype, t.shape) for t in enc.outputs] == [("codes", "int64", (1, "frames", 16))]


@on_proj
def test_full_decode_matches_reference(full_wav, reference_wav):
    assert full_wav.dtype == np.float32 and full_wav.shape == (FRAMES * 1920,)
    err = float(np.max(np.abs(full_wav - reference_wav)))
    assert err <= 2e-5, err  # 5x the measured 3.9e-6


@on_proj
@pytest.mark.parametrize("frames_per_run", [16, None], ids=["streamed", "one-run-per-segment"])
def test_decoder_runs_on_the_stream_graph_too(codec, codes, full_wav, reference_wav, frames_per_run):
    """On the stream graph, ``synthesize``'s decoder streams the utterance (default) or runs
    each segment at once: both across the 300-frame segment boundary, both as close to qwen-tts."""
    dec = Decoder(codec["decoder_stream"][0], frames_per_run=frames_per_run)
    wav = dec.decode(codes)
    assert wav.shape == (FRAMES * 1920,)
    assert float(np.max(np.abs(wav - full_wav))) <= 1e-4
    assert float(np.max(np.abs(wav - reference_wav))) <= 2e-5
    np.testing.assert_array_equal(dec.decode(codes), wav)  # a fresh utterance each call


@on_proj
def test_decode_without_segments_is_one_causal_pass(codec, reference, codes):
    import torch

    n = 40
    with torch.no_grad():
        ref = reference.model.speech_tokenizer.model.decoder(torch.from_numpy(codes[:n].T[None]))[0, 0].numpy()
    wav = Decoder(codec["decoder"][0], chunk_size=None).decode(codes[:n])
    assert float(np.max(np.abs(wav - ref))) <= 1e-4


@on_proj
@pytest.mark.parametrize("sizes", [[1], [3], [7], [5, 1, 13, 2, 64, 29, 1, 150, 45]],
                         ids=["one", "three", "seven", "uneven"])
def test_streaming_equals_full_decode(codec, codes, full_wav, reference_wav, sizes):
    dec = StreamingDecoder(codec["decoder_stream"][0])
    pieces, pos, k = [], 0, 0
    while pos < FRAMES:
        n = sizes[k % len(sizes)]
        out = dec.push(codes[pos:pos + n])
        assert out.shape == (min(n, FRAMES - pos) * 1920,)
        pieces.append(out)
        pos += n
        k += 1
    wav = np.concatenate(pieces)
    assert dec.frames == FRAMES
    # measured: <= 3.7e-6 against the full decode, <= 4.8e-6 against qwen-tts (all four push patterns); 4x margin
    assert float(np.max(np.abs(wav - full_wav))) <= 2e-5
    assert float(np.max(np.abs(wav - reference_wav))) <= 2e-5


@on_proj
def test_streaming_reset_and_empty_push(codec, codes, full_wav):
    dec = StreamingDecoder(codec["decoder_stream"][0])
    dec.push(codes[:9])
    dec.reset()
    assert dec.push(np.zeros((0, 16), np.int64)).shape == (0,)
    wav = np.concatenate([dec.push(codes[:20]), dec.push(codes[20:40])])
    assert float(np.max(np.abs(wav - full_wav[:40 * 1920]))) <= 1e-4


@on_proj
@pytest.mark.parametrize("sr,seconds", [(24000, 1.3), (24000, 11.0), (16000, 1.3)])
def test_encoder_matches_reference_ref_code(codec, reference, sr, seconds):
    wav = synthetic_voice(seconds, sr)
    if seconds > 10:  # odd length, > 250 encoder frames (Mimi's sliding_window is not applied)
        wav = wav[:-77]
    items = reference.create_voice_clone_prompt(ref_audio=(wav, sr), ref_text="A reference sentence.",
                                                x_vector_only_mode=False)
    ref = items[0].ref_code.numpy()
    codes = Encoder(codec["encoder"][0]).encode(wav, sr)
    assert codes.dtype == np.int64 and codes.shape == ref.shape
    match = float(np.mean(codes == ref))
    if sr == 24000:
        assert match == 1.0, match
    else:  # numpy resampler vs librosa's soxr: not bit-identical input
        assert match >= 0.9, match


def test_codes_are_checked():
    ok = check_codes(np.zeros((3, 16), np.int32))
    assert ok.dtype == np.int64 and ok.shape == (3, 16)
    with pytest.raises(KzttsError, match=r"shape \[frames, 16\], got \[3, 8\]"):
        check_codes(np.zeros((3, 8), np.int64))
    with pytest.raises(KzttsError, match=r"0\.\.2047, got values -1\.\.5"):
        check_codes(np.array([[5] * 15 + [-1]]))
    with pytest.raises(KzttsError, match="integers"):
        check_codes(np.zeros((2, 16), np.float32))


# ------------------------------------------------------------------ graph variants of the decoder
@pytest.fixture(scope="module")
def stream_graph(reference, tmp_path_factory):
    """name -> a decoder_stream session exported with those DecoderOptions (``plain``: none)."""
    import onnxruntime as ort

    from kztts.bundle.sessions import SessionConfig, _session_options
    from kztts.export.graphs.codec_graphs import DecoderOptions, DecoderStep, _decoder_of, export_stream_graph

    out = tmp_path_factory.mktemp("decoder-options")
    made = {}

    def make(name: str):
        if name not in made:
            fields = [] if name == "plain" else name.split("+")
            step = DecoderStep(_decoder_of(reference.model).decoder, DecoderOptions(**{f: True for f in fields}))
            path = export_stream_graph(step.eval(), out / name / "decoder_stream.onnx")
            made[name] = ort.InferenceSession(str(path), _session_options(SessionConfig(threads=1)),
                                              providers=["CPUExecutionProvider"])
        return made[name]
    return make


@on_proj
@pytest.mark.parametrize("name", ["conv2d", "tconv_as_conv", "fold_snake", "conv2d+tconv_as_conv+fold_snake"])
def test_decoder_options_keep_the_samples(stream_graph, codes, reference_wav, name):
    """Each rewrite of the graph is the same function: >= 80 dB against the plain graph and qwen-tts."""
    sizes = [5, 1, 13, 64, 29, 150, 45]  # crosses the 300-frame segment boundary
    wavs = {}
    for graph in ("plain", name):
        dec = StreamingDecoder(stream_graph(graph))
        pieces, pos = [], 0
        for n in sizes + [FRAMES]:
            pieces.append(dec.push(codes[pos:pos + n]))
            pos = min(pos + n, FRAMES)
        wavs[graph] = np.concatenate(pieces)
    assert wavs[name].shape == (FRAMES * 1920,)
    assert snr_db(wavs[name], wavs["plain"]) >= 80, snr_db(wavs[name], wavs["plain"])
    assert snr_db(wavs[name], reference_wav) >= 80, snr_db(wavs[name], reference_wav)


@on_proj
def test_default_export_is_the_benchmarked_choice(codec_dir):
    """The decoder graph ``export_decoder`` writes has the three rewrites benchmarks/decoder/README.md measured
    and chose, read from the ONNX graph itself (the plain graph of this decoder has 6 ConvTranspose,
    58 Exp, a Pow on every Sin and only 3-D Conv weights), and its manifest entry names them."""
    import collections

    import onnx

    from kztts.export.graphs.codec_graphs import DEFAULT_OPTIONS

    out, specs = codec_dir
    benchmarked = ROOT / "benchmarks" / "decoder" / "README.md"
    assert "| conv2d+tconv_as_conv+fold_snake | 1 | 4 |" in benchmarked.read_text()
    assert DEFAULT_OPTIONS.name == "conv2d+tconv_as_conv+fold_snake"
    for name in ("decoder", "decoder_stream"):
        spec = specs[name]
        assert spec.extra["decoder_options"] == "conv2d+tconv_as_conv+fold_snake"
        graph = onnx.load(str(out / spec.file), load_external_data=False).graph
        ops = collections.Counter(n.op_type for n in graph.node)
        rank = {i.name: len(i.dims) for i in graph.initializer}
        producer = {o: n.op_type for n in graph.node for o in n.output}
        # tconv_as_conv: every ConvTranspose (kernel 2 * stride here) became a Conv + interleave
        assert ops["ConvTranspose"] == 0, (name, ops["ConvTranspose"])
        # fold_snake: exp(alpha), 1 / (exp(beta) + eps) are initializers, sin^2 is a Mul, not a Pow of a Sin
        assert ops["Sin"] > 0 and ops["Exp"] == 0, (name, ops["Exp"])
        assert not [n for n in graph.node if n.op_type == "Pow" and producer.get(n.input[0]) == "Sin"], name
        # conv2d: the vocoder's convolutions are 2-D (4-D weights); the ones before it stay 1-D
        ranks = collections.Counter(rank.get(n.input[1]) for n in graph.node if n.op_type == "Conv")
        assert ranks[4] >= 30 and set(ranks) <= {3, 4}, (name, ranks)


# ------------------------------------------------------------------ background decoder (pipelined stream)
class FakeDecoder:
    """push(codes) -> the codes' first column as float samples; fails on the push numbered ``fail_at``."""

    def __init__(self, fail_at: int | None = None, delay: float = 0.0):
        self.calls, self.fail_at, self.delay = 0, fail_at, delay

    def push(self, codes):
        import time

        time.sleep(self.delay)
        self.calls += 1
        if self.calls == self.fail_at:
            raise KzttsError("decoder broke")
        return np.asarray(codes)[:, 0].astype(np.float32)


def test_background_decoder_keeps_order_and_counts_busy_time():
    from kztts.runners.codec import BackgroundDecoder

    worker = BackgroundDecoder(FakeDecoder(delay=0.01))
    try:
        for k in range(5):
            worker.submit(np.full((2, 16), k))
        outs = [worker.wait() for _ in range(5)]
        assert [o.tolist() for o in outs] == [[k, k] for k in range(5)]
        assert worker.pending == 0 and worker.wait() is None and worker.poll() is None
        assert worker.busy >= 0.05
    finally:
        worker.close()


def test_background_decoder_error_reaches_the_caller_and_later_jobs_fail_too():
    import threading

    from kztts.runners.codec import BackgroundDecoder

    worker = BackgroundDecoder(FakeDecoder(fail_at=2), name="kztts-decoder-test")
    for k in range(4):
        worker.submit(np.full((1, 16), k))
    assert worker.wait().tolist() == [0]
    for _ in range(3):  # the failed job and every one after it: raised, never a hang
        with pytest.raises(KzttsError, match="decoder broke"):
            worker.wait()
    worker.close()
    assert not [t for t in threading.enumerate() if t.name == "kztts-decoder-test"]
    with pytest.raises(KzttsError, match="closed"):
        worker.submit(np.zeros((1, 16), np.int64))
