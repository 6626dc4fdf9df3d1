"""``kztts serve`` on tiny bundles, over real sockets: the official ``openai`` client and raw HTTP against a
live server process. Each response equals the same request run alone (``kztts synth``, ``TTS.synthesize`` /
``TTS.stream``, ``LM.generate``), also when 16 clients speak at once; the queue limit, a client that
leaves, bad requests and SIGTERM. Each module of kztts.server has its own tests beside this one
(tests/server/test_<module>.py)."""
from __future__ import annotations

import base64
import http.client
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from support import KEY, Server, int16_of_wav, raw, start_server, stop
from kztts.assistant.spoken_reply import SpeakSettings, speak_text
from kztts.bundle.bundle import Bundle
from kztts.bundle.sessions import SessionConfig
from kztts.server.audio_out import pcm16
from kztts.tts.tts import TTS

openai = pytest.importorskip("openai")
sf = pytest.importorskip("soundfile")

CONTEXT = 128  # Talker positions per request (the ``tts`` fixture's): the long text below is spoken in pieces
SHORT = "Hello from the server."
LONG = ("The first sentence of a longer text is here. The second sentence follows it, with a clause; and then "
        "some more words so that the whole text needs more than one context. A third sentence ends it all!")


def metric(server: Server, name: str) -> float:
    _, _, text = raw(server, "GET", "/metrics")
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith((name + " ", name + "{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def healthy(server: Server) -> None:
    status, _, body = raw(server, "GET", "/health", key=None)
    assert status == 200 and json.loads(body)["status"] == "ready", (status, body, server.tail())


def int16_of(samples: np.ndarray) -> np.ndarray:
    """The 16-bit samples ``kztts synth`` writes for float samples (kztts.core.audio.write_wav)."""
    buf = io.BytesIO()
    sf.write(buf, np.clip(samples, -1, 1), 24000, format="WAV", subtype="PCM_16")
    return int16_of_wav(buf.getvalue())


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory, tts):
    from kztts.core.audio import synthetic_voice, write_wav

    d = tmp_path_factory.mktemp("voices")
    write_wav(d / "alice.wav", synthetic_voice(seed=1), 24000)
    np.save(d / "bob.npy", tts.voice_from_wav(synthetic_voice(seconds=2.0, seed=2), 24000).speaker)
    (d / "notes.txt").write_text("not a voice")
    return d


@pytest.fixture(scope="module")
def tts_wide(equal_bundle):
    """The default context, as ``small_server`` runs."""
    from kztts.tts.tts import TTS

    return TTS(equal_bundle)


@pytest.fixture(scope="module")
def voices(tts, voices_dir):
    from kztts.core.audio import read_voice, synthetic_voice

    return {"alice": tts.voice_from_wav(*read_voice(voices_dir / "alice.wav")),
            "bob": tts.voice_from_xvector(voices_dir / "bob.npy"),
            "default": tts.voice_from_wav(synthetic_voice(), 24000)}


@pytest.fixture(scope="module")
def server(equal_bundle, voices_dir, tmp_path_factory):
    s = start_server(equal_bundle, tmp_path_factory.mktemp("log") / "serve.log", "--voices", str(voices_dir),
                     "--batch", "4", "--queue", "16", "--context", str(CONTEXT), "--api-key", KEY)
    yield s
    assert stop(s) == 0, s.tail()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def solo(tts, voices, text: str, voice: str, seed: int, max_frames: int | None, stream: bool) -> np.ndarray:
    """The request run alone in this process: 16-bit samples of its ``synthesize`` or ``stream``."""
    options = dict(seed=seed, max_frames=max_frames)
    if stream:
        return int16_of(np.concatenate(list(tts.stream(text, voices[voice], **options))))
    return int16_of(tts.synthesize(text, voices[voice], **options).samples)


# ---------------------------------------------------------------- speech
def test_speech_equals_kztts_synth(server, client, equal_bundle, voices_dir, tmp_path):
    """Whole WAV = ``kztts synth``; streamed pcm (first bytes long before the end) = ``kztts synth --stream``."""
    body = dict(model="tts-1", voice="alice", input=SHORT)
    wav = client.audio.speech.create(**body, response_format="wav", extra_body={"seed": 3, "max_frames": 50}).content
    started = time.perf_counter()
    first = None
    pcm = bytearray()
    with client.audio.speech.with_streaming_response.create(**body, response_format="pcm",
                                                            extra_body={"seed": 4, "max_frames": 100}) as r:
        assert r.headers["content-type"] == "audio/pcm"
        for chunk in r.iter_bytes():
            first = first or time.perf_counter() - started
            pcm += chunk
    total = time.perf_counter() - started
    # streamed: the first chunk (4 of 100 frames) arrives well before the end; measured ~0.05 s of ~1 s alone
    assert first < 0.5 * total, (first, total)
    for out, stream, seed, frames in ((tmp_path / "whole.wav", False, 3, 50), (tmp_path / "stream.wav", True, 4, 100)):
        subprocess.run([sys.executable, "-m", "kztts.cli.main", "-q", "synth", SHORT, "--bundle", str(equal_bundle),
                        "--speaker-wav", str(voices_dir / "alice.wav"), "--seed", str(seed), "--max-frames",
                        str(frames), "-o", str(out), *(["--stream"] if stream else [])],
                       check=True, capture_output=True, env={**os.environ, "KZTTS_THREADS": "1"})
    assert np.array_equal(int16_of_wav(wav), int16_of_wav((tmp_path / "whole.wav").read_bytes()))
    expected = int16_of_wav((tmp_path / "stream.wav").read_bytes())
    assert np.array_equal(np.frombuffer(bytes(pcm), "<i2"), expected)
    assert len(expected) == 100 * 1920  # this seed speaks to its max_frames: the stream had 25 chunks


def test_sixteen_clients_at_once_each_equal_its_solo_run(server, client, tts, voices):
    """Different texts, voices, seeds, formats; a long text in pieces (whole and streamed); batch 4."""
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    cases = []
    for i in range(16):
        text = LONG if i in (5, 12) else f"Request {words[i % 8]} says hello, number {i}."
        cases.append(dict(text=text, voice=("alice", "bob", "default")[i % 3], seed=100 + i,
                          max_frames=None if text == LONG else 20 + 3 * i, stream=i % 2 == 1))
    assert len(tts.pieces(LONG, voices["alice"])) > 1

    def ask(case: dict) -> bytes:
        body = dict(model="tts-1", voice=case["voice"], input=case["text"],
                    extra_body={"seed": case["seed"], **({"max_frames": case["max_frames"]} if case["max_frames"]
                                                         else {})})
        if case["stream"]:
            with client.audio.speech.with_streaming_response.create(**body, response_format="pcm") as r:
                return r.read()
        return client.audio.speech.create(**body, response_format="wav").content

    with ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(ask, cases))
    for case, data in zip(cases, outputs):
        got = np.frombuffer(data, "<i2") if case["stream"] else int16_of_wav(data)
        want = solo(tts, voices, case["text"], case["voice"], case["seed"], case["max_frames"], case["stream"])
        assert np.array_equal(got, want), case
    _wait_for(lambda: metric(server, "kztts_running_streams") == 0, "the rows to empty", server)
    assert metric(server, 'kztts_time_to_first_audio_seconds_count') >= 16
    healthy(server)


NOT_JSON = b"{bad json"


@pytest.mark.parametrize("name, method, path, body, key, status, code", [
    ("empty input", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "  "}, KEY, 400, "empty_input"),
    ("huge input", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "a" * 5000}, KEY, 413, "input_too_long"),
    ("huge body", "POST", "/v1/audio/speech", b"{" + b" " * (1 << 21) + b"}", KEY, 413, "body_too_large"),
    ("unknown voice", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "voice": "../alice"}, KEY, 404,
     "voice_not_found"),
    ("unknown model", "POST", "/v1/audio/speech", {"model": "nope", "input": "hi"}, KEY, 404, "model_not_found"),
    ("chat on a TTS bundle", "POST", "/v1/chat/completions", {"model": "tts-1", "messages": [
        {"role": "user", "content": "hi"}]}, KEY, 404, "model_not_found"),
    ("input not a string", "POST", "/v1/audio/speech", {"model": "tts-1", "input": 5}, KEY, 400, "invalid_type"),
    ("seed not an integer", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "seed": "1"}, KEY, 400,
     "invalid_type"),
    ("temperature out of range", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "temperature": -1},
     KEY, 400, "invalid_value"),
    ("unknown language", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "language": "klingon"}, KEY,
     400, "invalid_value"),
    ("max_frames above the limit", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "max_frames": 9999},
     KEY, 400, "above_limit"),
    ("unknown key", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "sped": 1}, KEY, 400,
     "unknown_parameter"),
    ("bad JSON", "POST", "/v1/audio/speech", NOT_JSON, KEY, 400, "invalid_json"),
    ("JSON not an object", "POST", "/v1/audio/speech", b"[1, 2]", KEY, 400, "invalid_json"),
    ("wrong key", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi"}, "wrong", 401, "invalid_api_key"),
    ("no key", "GET", "/v1/models", None, None, 401, "invalid_api_key"),
    ("speed 2.0", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "speed": 2.0}, KEY, 400,
     "unsupported_parameter"),
    ("aac", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "response_format": "aac"}, KEY, 400,
     "invalid_value"),
    ("flac streamed", "POST", "/v1/audio/speech", {"model": "tts-1", "input": "hi", "response_format": "flac",
                                                   "stream_format": "audio"}, KEY, 400, "invalid_value"),
    ("unknown route", "GET", "/v2/nothing", None, KEY, 404, "not_found"),
    ("wrong method", "GET", "/v1/audio/speech", None, KEY, 405, None),
])
def test_bad_requests_are_openai_errors_and_the_server_goes_on(server, name, method, path, body, key, status, code):
    got, _, data = raw(server, method, path, body, key=key)
    assert got == status, (name, data)
    error = json.loads(data)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], (name, error)
    assert error["code"] == code, (name, error)
    assert "Traceback" not in error["message"]
    healthy(server)


def test_formats_and_the_default_voice(server, tts, voices):
    """No voice is the default one; flac/mp3/opus decode; a streamed wav and SSE carry the stream's samples."""
    base = {"model": "tts-1", "input": SHORT, "seed": 7, "max_frames": 30}
    want_whole = solo(tts, voices, SHORT, "default", 7, 30, stream=False)
    want_stream = solo(tts, voices, SHORT, "default", 7, 30, stream=True)
    status, headers, data = raw(server, "POST", "/v1/audio/speech", {**base, "response_format": "flac"})
    assert status == 200 and headers["content-type"] == "audio/flac"
    assert np.array_equal(int16_of_wav(data), want_whole)  # flac is lossless
    for fmt in ("mp3", "opus"):
        status, headers, data = raw(server, "POST", "/v1/audio/speech", {**base, "response_format": fmt})
        assert status == 200, data
        x, _ = sf.read(io.BytesIO(data), dtype="float32")
        assert abs(len(x) - len(want_whole)) < 0.1 * len(want_whole) and np.abs(x).max() > 0.01, fmt
    status, headers, data = raw(server, "POST", "/v1/audio/speech", {**base, "response_format": "wav",
                                                                     "stream_format": "audio"})
    assert status == 200 and headers.get("transfer-encoding") == "chunked"
    assert data[:4] == b"RIFF" and np.array_equal(np.frombuffer(data[44:], "<i2"), want_stream)
    status, headers, data = raw(server, "POST", "/v1/audio/speech", {**base, "response_format": "pcm",
                                                                     "stream_format": "sse"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] == 30
    assert np.array_equal(np.frombuffer(pcm, "<i2"), want_stream)
    status, _, body = raw(server, "GET", "/v1/audio/voices")
    assert status == 200 and sorted(v["id"] for v in json.loads(body)["data"]) == ["alice", "bob", "default"]


# ---------------------------------------------------------------- the queue, a client that leaves, SIGTERM
@pytest.fixture(scope="module")
def small_server(equal_bundle, tmp_path_factory):
    """One row, one waiting request at most."""
    s = start_server(equal_bundle, tmp_path_factory.mktemp("log") / "small.log", "--batch", "1", "--queue", "1")
    yield s
    if s.proc.poll() is None:
        stop(s)


def _open_stream(server: Server, body: dict, path: str = "/v1/audio/speech"
                 ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection(*server.host_port, timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _wait_for(condition, what: str, server: Server, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{server.tail()}"
        time.sleep(0.02)


def test_queue_limit_and_a_client_that_leaves(small_server, tts_wide, voices):
    tts = tts_wide
    s = small_server
    long_run = dict(model="tts-1", input="Hold the line, please.", seed=1, max_frames=600, response_format="pcm")
    # alone, this request speaks all 600 frames (no EOS before): its row is taken for ~6 s at tiny speed
    assert len(tts.generate_codes(long_run["input"], voices["default"], seed=1, max_frames=600)) == 600
    conn_a, resp_a = _open_stream(s, long_run)
    assert resp_a.status == 200 and len(resp_a.read(7680)) == 7680  # A holds the only row
    waited: dict = {}

    def b() -> None:
        body = dict(model="tts-1", input=SHORT, seed=5, max_frames=25, response_format="wav")
        waited["status"], _, waited["data"] = raw(s, "POST", "/v1/audio/speech", body, key=None)

    thread = threading.Thread(target=b)
    thread.start()
    _wait_for(lambda: metric(s, "kztts_queue_depth") == 1, "B to wait in the queue", s)
    status, headers, data = raw(s, "POST", "/v1/audio/speech", dict(model="tts-1", input="C"), key=None)
    assert status == 429 and int(headers["retry-after"]) >= 1 and json.loads(data)["error"]["code"] == "queue_full"
    conn_a.close()  # A leaves mid-stream: its row is free at the next frame and B starts
    thread.join(timeout=60)
    assert waited["status"] == 200
    assert np.array_equal(int16_of_wav(waited["data"]), solo(tts, voices, SHORT, "default", 5, 25, stream=False))
    assert metric(s, "kztts_cancelled_total") == 1
    # A stopped early: run to its end, A alone makes 600 frames (checked above) and B 25 more
    assert metric(s, "kztts_frames_total") < 600
    _wait_for(lambda: metric(s, "kztts_running_streams") == 0, "the rows to empty", s)
    healthy(s)


def test_sigterm_drains_then_exits_0(small_server, tts_wide, voices):
    tts = tts_wide
    s = small_server
    body = dict(model="tts-1", input=SHORT, seed=2, max_frames=150, response_format="pcm")
    conn, resp = _open_stream(s, body)
    head = resp.read(7680)
    s.proc.send_signal(signal.SIGTERM)
    _wait_for(lambda: raw(s, "GET", "/health", key=None)[0] == 503, "the drain to begin", s)
    status, _, data = raw(s, "POST", "/v1/audio/speech", dict(model="tts-1", input="late"), key=None)
    assert status == 503 and json.loads(data)["error"]["code"] == "draining"
    rest = resp.read()
    conn.close()
    assert np.array_equal(np.frombuffer(head + rest, "<i2"), solo(tts, voices, SHORT, "default", 2, 150, stream=True))
    assert s.proc.wait(timeout=60) == 0, s.tail()
    assert "drained" in s.tail()


# ---------------------------------------------------------------- chat
@pytest.fixture(scope="module")
def chat_server(chat_bundle, tmp_path_factory):
    s = start_server(chat_bundle, tmp_path_factory.mktemp("log") / "chat.log", "--batch", "3", "--queue", "8")
    yield s
    assert stop(s) == 0, s.tail()


def _alone(lm, messages: list[dict], max_tokens: int, **options) -> str:
    from kztts.lm.chatml import render

    messages = [{**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages]  # OpenAI's name
    return "".join(lm.generate(render(messages, default_system=lm.default_system), max_tokens, **options))


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bonjour ?"},
     {"role": "assistant", "content": "Salut."}, {"role": "user", "content": "你好"}],
    [{"role": "user", "content": "def add(a, b):"}],
    [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Why is the sky blue?"}],
]


def test_chat_equals_lm_generate(chat_server, lm, chat_bundle):
    from kztts.generation.sampling import SamplingParams

    client = openai.OpenAI(base_url=chat_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    assert model == Path(chat_bundle).name
    sampled = dict(temperature=0.8, top_p=0.9, seed=5)
    params = {**lm.params.__dict__, "temperature": 0.8, "top_p": 0.9, "greedy": False}
    # greedy, not streamed
    reply = client.chat.completions.create(model=model, messages=CONVERSATIONS[0], max_tokens=24, temperature=0)
    assert reply.choices[0].message.content == _alone(lm, CONVERSATIONS[0], 24, greedy=True)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 24
    # sampled with a seed, streamed
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=CONVERSATIONS[1], max_tokens=30, stream=True, **sampled) if c.choices]
    assert "".join(pieces) == _alone(lm, CONVERSATIONS[1], 30, params=SamplingParams(**params), seed=5)
    # several conversations at once (batch 3, 4 clients: one joins as another leaves), each as alone
    jobs = [(c, 16 + 6 * i, i % 2 == 0) for i, c in enumerate(CONVERSATIONS)] * 2

    def ask(job) -> str:
        messages, n, stream = job
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model=model, messages=messages, max_completion_tokens=n, stream=True, **sampled) if c.choices)
        return client.chat.completions.create(model=model, messages=messages, max_tokens=n,
                                              **sampled).choices[0].message.content

    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(ask, jobs))
    for (messages, n, _), text in zip(jobs, got):
        assert text == _alone(lm, messages, n, params=SamplingParams(**params), seed=5)
    assert "talker_batched" in raw(chat_server, "GET", "/health", key=None)[2].decode()


@pytest.mark.parametrize("body, status, code", [
    ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found"),
    ({"model": "{model}", "messages": "hi"}, 400, "invalid_type"),
    ({"model": "{model}", "messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_value"),
    ({"model": "{model}", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "unsupported_parameter"),
    ({"model": "{model}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}, 400, "above_limit"),
    ({"model": "{model}", "messages": [{"role": "user", "content": "hi " * 3000}]}, 400, "context_length_exceeded"),
    ({"model": "{model}", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400,
     "invalid_type"),
    ({"model": "{model}", "input": "hi"}, 400, "unknown_parameter"),
])
def test_bad_chat_requests(chat_server, chat_bundle, body, status, code):
    body = {k: (Path(chat_bundle).name if v == "{model}" else v) for k, v in body.items()}
    got, _, data = raw(chat_server, "POST", "/v1/chat/completions", body, key=None)
    assert got == status, data
    assert json.loads(data)["error"]["code"] == code
    healthy(chat_server)


def test_without_batched_graphs_requests_run_one_at_a_time(equal_bundle, chat_bundle, voices_dir, tmp_path_factory):
    """The plain attention graphs have no batched form: the server says so and serves requests in turn,
    each equal to its run alone (on the same plain graphs)."""
    from kztts.core.audio import read_voice
    from kztts.generation.sampling import SamplingParams
    from kztts.lm.lm import LM
    from kztts.tts.tts import TTS

    logs = tmp_path_factory.mktemp("log")
    plain = {"KZTTS_ATTENTION": "plain"}
    speech, chat = (start_server(equal_bundle, logs / "speech.log", "--voices", str(voices_dir), env=plain),
                    start_server(chat_bundle, logs / "chat.log", env=plain))
    try:
        for s, what in ((speech, "request"), (chat, "conversation")):
            assert f"one {what} at a time" in json.loads(raw(s, "GET", "/health", key=None)[2])["mode"]
        tts = TTS(equal_bundle, attention="plain")
        alice = tts.voice_from_wav(*read_voice(voices_dir / "alice.wav"))
        body = dict(model="tts-1", input=SHORT, voice="alice", max_frames=30)
        with ThreadPoolExecutor(2) as pool:
            whole, streamed = pool.map(lambda b: raw(speech, "POST", "/v1/audio/speech", b, key=None),
                                       [{**body, "seed": 1, "response_format": "wav"},
                                        {**body, "seed": 2, "response_format": "pcm"}])
        want = tts.synthesize(SHORT, alice, seed=1, max_frames=30).samples
        assert np.array_equal(int16_of_wav(whole[2]), int16_of(want))
        assert np.array_equal(np.frombuffer(streamed[2], "<i2"),
                              int16_of(np.concatenate(list(tts.stream(SHORT, alice, seed=2, max_frames=30)))))
        lm = LM(chat_bundle, attention="plain")
        params = SamplingParams(**{**lm.params.__dict__, "temperature": 0.7, "greedy": False})
        model = Path(chat_bundle).name
        asks = [{"model": model, "messages": m, "max_tokens": 20, "temperature": 0.7, "seed": 9, "stream": i == 1}
                for i, m in enumerate(CONVERSATIONS[:2])]
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda b: raw(chat, "POST", "/v1/chat/completions", b, key=None), asks))
        first = json.loads(answers[0][2])["choices"][0]["message"]["content"]
        second = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                         for line in answers[1][2].decode().splitlines()
                         if line.startswith("data: {") and json.loads(line[6:])["choices"])
        assert first == _alone(lm, CONVERSATIONS[0], 20, params=params, seed=9)
        assert second == _alone(lm, CONVERSATIONS[1], 20, params=params, seed=9)
    finally:
        assert stop(speech) == 0 and stop(chat) == 0


def test_command_line_refusals_are_one_line(equal_bundle, tmp_path):
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    cases = [([str(tmp_path / "none")], "no such bundle folder"),
             ([str(equal_bundle), "--batch", "0"], "--batch must be"),
             ([str(equal_bundle), "--voices", str(tmp_path / "none")], "--voices must be a folder"),
             ([str(equal_bundle), "--port", str(busy.getsockname()[1])], "cannot listen on")]
    try:
        for args, words in cases:
            r = subprocess.run([sys.executable, "-m", "kztts.cli.main", "serve", *args], capture_output=True,
                               text=True, timeout=120, check=False)
            assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r)
    finally:
        busy.close()


# ---------------------------------------------------------------- spoken chat (kztts serve LM --tts TTS)
SPOKEN_MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def spoken_server(chat_bundle, equal_bundle, voices_dir, tmp_path_factory):
    s = start_server(chat_bundle, tmp_path_factory.mktemp("log") / "spoken.log", "--tts", str(equal_bundle),
                     "--voices", str(voices_dir), "--batch", "3")
    yield s
    assert stop(s) == 0, s.tail()


@pytest.fixture(scope="module")
def solo_tts(equal_bundle):
    """The server's TTS as it runs there (one ONNX Runtime thread: KZTTS_THREADS=1)."""
    return TTS(Bundle.open(equal_bundle, SessionConfig(threads=1), load_graphs=False))


def _solo(tts: TTS, transcript: str, seed: int, voice=None) -> np.ndarray:
    """The reply's samples as ``kztts synth --sentences`` speaks its transcript alone (the server's "default"
    voice unless ``voice`` is given)."""
    from kztts.core.audio import synthetic_voice

    voice = voice if voice is not None else tts.voice_from_wav(synthetic_voice(), 24000)
    samples, _ = speak_text(tts, transcript, SpeakSettings(voice, seed=seed, settings=tts.default_settings()))
    return samples


def _spoken_sse(data: bytes) -> tuple[str, bytes, list[str]]:
    """A streamed spoken reply's transcript, pcm16 bytes and finish reasons, from its raw event stream."""
    transcript, pcm, finish = "", b"", []
    assert data.rstrip().endswith(b"data: [DONE]"), data[-300:]
    for line in data.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                audio = choice["delta"].get("audio") or {}
                transcript += audio.get("transcript") or ""
                pcm += base64.b64decode(audio.get("data") or "")
                finish += [choice["finish_reason"]] if choice["finish_reason"] else []
    return transcript, pcm, finish


def test_spoken_reply_with_the_openai_client(spoken_server, solo_tts, chat_bundle):
    client = openai.OpenAI(base_url=spoken_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=SPOKEN_MESSAGES, max_tokens=12, temperature=0, seed=3,
                                           modalities=["text", "audio"], audio={"voice": "default", "format": "wav"})
    audio = reply.choices[0].message.audio
    print(f"\nspoken chat, openai client: transcript {audio.transcript!r}, {len(audio.data)} base64 chars, "
          f"id {audio.id}, expires_at {audio.expires_at}")
    assert audio.id.startswith("audio_") and audio.expires_at > reply.created and reply.choices[0].message.content is None
    wav, sr = sf.read(io.BytesIO(base64.b64decode(audio.data)), dtype="int16")
    want = _solo(solo_tts, audio.transcript, seed=3)
    assert sr == 24000
    np.testing.assert_array_equal(wav, int16_of(want))  # kztts synth's WAV of the same samples
    # the same request streamed: transcript pieces and pcm16 data in delta.audio
    pieces, data, ends = [], b"", []
    for chunk in client.chat.completions.create(model=model, messages=SPOKEN_MESSAGES, max_tokens=12, temperature=0, seed=3,
                                                modalities=["text", "audio"], stream=True,
                                                audio={"voice": "default", "format": "pcm16"}):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.audio is not None:
            pieces.append(delta.audio.transcript or "")
            data += base64.b64decode(delta.audio.data or "")
            if delta.audio.expires_at:
                ends.append(delta.audio.expires_at)
    assert "".join(pieces) == audio.transcript and len(ends) == 1
    np.testing.assert_array_equal(data, pcm16(want))
    # text only on the same server, and the metrics of both modalities
    text = client.chat.completions.create(model=model, messages=SPOKEN_MESSAGES, max_tokens=12, temperature=0, seed=3)
    assert text.choices[0].message.content == audio.transcript
    assert metric(spoken_server, "kztts_chat_time_to_first_audio_seconds_count") >= 2
    voices = raw(spoken_server, "GET", "/v1/audio/voices")
    assert voices[0] == 200 and b'"default"' in voices[2]
    card = json.loads(raw(spoken_server, "GET", "/v1/models")[2])["data"][0]
    assert card["kind"] == "chat" and card["tts"]["kind"] == "base"  # the TTS that speaks the replies


def test_spoken_and_text_chats_at_once_share_the_batch_and_equal_their_solo_replies(spoken_server, solo_tts, lm,
                                                                                   voices_dir, chat_bundle):
    """Three spoken replies (different voices, seeds, whole and streamed) and two text-only chats at --batch 3:
    each transcript is the LM's reply alone, each reply's audio ``kztts synth --sentences`` of it alone."""
    from kztts.core.audio import read_voice
    from kztts.generation.sampling import SamplingParams

    client = openai.OpenAI(base_url=spoken_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    model = Path(chat_bundle).name
    health = json.loads(raw(spoken_server, "GET", "/health", key=None)[2])
    assert health["batch"] == 3 and "up to 3 conversations share each token" in health["mode"]
    assert "up to 3 requests share each frame" in health["mode"]
    voices = {"alice": solo_tts.voice_from_wav(*read_voice(voices_dir / "alice.wav")),
              "bob": solo_tts.voice_from_xvector(voices_dir / "bob.npy"), "default": None}
    asks = [(CONVERSATIONS[0], "alice", 3, False), (CONVERSATIONS[1], "bob", 4, True),
            (CONVERSATIONS[3], "default", 5, False), (CONVERSATIONS[0], None, 6, False), (CONVERSATIONS[2], None, 7, True)]
    first_tokens = metric(spoken_server, "kztts_time_to_first_token_seconds_count")
    first_audios = metric(spoken_server, "kztts_chat_time_to_first_audio_seconds_count")

    def ask(case) -> tuple[str, np.ndarray | bytes | None]:
        messages, voice, seed, stream = case
        options = dict(model=model, messages=messages, max_tokens=16, temperature=0.7, seed=seed)
        if voice is None:  # text only
            if stream:
                return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    **options, stream=True) if c.choices), None
            return client.chat.completions.create(**options).choices[0].message.content, None
        if stream:
            r = raw(spoken_server, "POST", "/v1/chat/completions", {**options, "stream": True, "modalities": [
                "text", "audio"], "audio": {"voice": voice, "format": "pcm16"}}, key=None)
            transcript, pcm, finish = _spoken_sse(r[2])
            assert len(finish) == 1
            return transcript, pcm
        audio = client.chat.completions.create(**options, modalities=["text", "audio"],
                                               audio={"voice": voice, "format": "wav"}).choices[0].message.audio
        return audio.transcript, sf.read(io.BytesIO(base64.b64decode(audio.data)), dtype="int16")[0]

    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(ask, asks))
    params = SamplingParams(**{**lm.params.__dict__, "temperature": 0.7, "greedy": False})
    for (messages, voice, seed, stream), (text, audio) in zip(asks, answers):
        assert text == _alone(lm, messages, 16, params=params, seed=seed), (voice, seed)
        if voice is not None:
            want = _solo(solo_tts, text, seed, voices[voice])
            if stream:
                assert audio == pcm16(want), (voice, seed)
            else:
                np.testing.assert_array_equal(audio, int16_of(want))
    # the time to first token counts the text chats, the time to first audio the spoken ones
    assert metric(spoken_server, "kztts_time_to_first_token_seconds_count") - first_tokens == 2
    assert metric(spoken_server, "kztts_chat_time_to_first_audio_seconds_count") - first_audios == 3


HOLD = [{"role": "user", "content": "Hold the line, please."}]  # greedy, the tiny LM writes all 400 tokens


@pytest.fixture(scope="module")
def small_spoken_server(chat_bundle, equal_bundle, tmp_path_factory):
    """One conversation, one waiting at most."""
    s = start_server(chat_bundle, tmp_path_factory.mktemp("log") / "small-spoken.log", "--tts", str(equal_bundle),
                     "--batch", "1", "--queue", "1")
    yield s
    if s.proc.poll() is None:
        stop(s)


def _hold(chat_bundle, tokens: int) -> dict:
    """A streamed spoken reply that holds its row for a while: 400 tokens are ~64 s of audio, ~5 s alone on 1
    thread at tiny speed."""
    return {"model": Path(chat_bundle).name, "messages": HOLD, "max_tokens": tokens, "temperature": 0, "seed": 1,
            "stream": True, "modalities": ["text", "audio"], "audio": {"voice": "default", "format": "pcm16"}}


def test_spoken_chat_queue_and_body_limits_and_a_client_that_leaves(small_spoken_server, solo_tts, lm, chat_bundle):
    s = small_spoken_server
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    spoken = dict(model=Path(chat_bundle).name, messages=SPOKEN_MESSAGES, max_tokens=8, temperature=0, seed=5,
                  modalities=["text", "audio"], audio={"voice": "default", "format": "wav"})
    conn_a, resp_a = _open_stream(s, _hold(chat_bundle, 400), "/v1/chat/completions")
    assert resp_a.status == 200 and resp_a.readline().startswith(b"data: ")  # A holds the only row
    waited: dict = {}

    def b() -> None:
        waited["reply"] = client.chat.completions.create(**spoken)

    thread = threading.Thread(target=b)
    thread.start()
    _wait_for(lambda: metric(s, "kztts_queue_depth") == 1, "B to wait in the queue", s)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(**spoken)
    assert refused.value.status_code == 429 and refused.value.code == "queue_full"
    assert int(refused.value.response.headers["retry-after"]) >= 1 and "--queue 1" in refused.value.message
    with pytest.raises(openai.APIStatusError) as too_big:  # a body over the limit (1 MiB) is refused unread
        client.chat.completions.create(**{**spoken, "messages": [{"role": "user", "content": "a" * (1 << 20)}]})
    assert too_big.value.status_code == 413 and too_big.value.code == "body_too_large"
    conn_a.close()  # A leaves mid-reply: its rows are free at the next step and B starts
    thread.join(timeout=120)
    audio = waited["reply"].choices[0].message.audio
    assert audio.transcript == _alone(lm, SPOKEN_MESSAGES, 8, greedy=True)
    want = int16_of(_solo(solo_tts, audio.transcript, seed=5))
    np.testing.assert_array_equal(sf.read(io.BytesIO(base64.b64decode(audio.data)), dtype="int16")[0], want)
    assert metric(s, "kztts_cancelled_total") == 1
    _wait_for(lambda: metric(s, "kztts_running_streams") == 0, "the rows to empty", s)
    healthy(s)


def test_sigterm_lets_a_spoken_reply_finish_then_exits_0(small_spoken_server, solo_tts, lm, chat_bundle):
    s = small_spoken_server
    conn, resp = _open_stream(s, _hold(chat_bundle, 150), "/v1/chat/completions")
    head = resp.readline()
    s.proc.send_signal(signal.SIGTERM)
    _wait_for(lambda: raw(s, "GET", "/health", key=None)[0] == 503, "the drain to begin", s)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as late:
        client.chat.completions.create(model=Path(chat_bundle).name, messages=SPOKEN_MESSAGES, max_tokens=4,
                                       modalities=["text", "audio"], audio={"voice": "default", "format": "wav"})
    assert late.value.status_code == 503 and late.value.code == "draining"
    transcript, pcm, finish = _spoken_sse(head + resp.read())
    conn.close()
    assert finish == ["length"] and transcript == _alone(lm, HOLD, 150, greedy=True)
    assert pcm == pcm16(_solo(solo_tts, transcript, seed=1))  # the whole reply, as spoken alone
    assert s.proc.wait(timeout=60) == 0, s.tail()
    assert "1 running and 0 waiting finish first" in s.tail() and "drained" in s.tail()  # it ran at the signal


@pytest.mark.parametrize("extra, status, code", [
    ({"modalities": ["text", "audio"]}, 400, "missing_required_parameter"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "default", "format": "mp3"}}, 400, None),
    ({"modalities": ["text", "audio"], "audio": {"voice": "default", "format": "wav"}, "stream": True}, 400, None),
    ({"modalities": ["audio"], "audio": {"voice": "default", "format": "wav"}}, 400, None),
    ({"modalities": ["text", "audio"], "audio": {"voice": "nobody", "format": "wav"}}, 404, "voice_not_found"),
])
def test_bad_spoken_requests(spoken_server, chat_bundle, extra, status, code):
    got, _, body = raw(spoken_server, "POST", "/v1/chat/completions",
                       {"model": Path(chat_bundle).name, "messages": SPOKEN_MESSAGES, "max_tokens": 4, **extra})
    assert got == status, body
    if code:
        assert f'"{code}"'.encode() in body


# ---------------------------------------------------------------- the page at / (a real headless Chromium)
def _chromium() -> str:
    """The system Chromium (Debian's package) driven by Playwright, or a skip saying what is missing."""
    import shutil

    path = shutil.which("chromium") or shutil.which("chromium-browser")
    reason = None
    if path is None:
        reason = "no chromium on PATH (apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is not installed (pip install playwright; it drives the system chromium)"
    if reason:
        print(f"skipping the page test: {reason}")
        pytest.skip(reason)
    return path


SHOTS_VARIABLE = "KZTTS_PAGE_SCREENSHOTS"  # a folder (docs/ to refresh the docs' screenshots); unset: the test's tmp


def _shots(tmp_path: Path) -> Path:
    """Where the page tests save their screenshots."""
    folder = Path(os.environ.get(SHOTS_VARIABLE) or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _browser(p, chromium: str):
    return p.chromium.launch(executable_path=chromium, headless=True,
                             args=["--autoplay-policy=no-user-gesture-required", "--no-sandbox"])


@pytest.mark.slow  # a real browser: two servers start and Debian's chromium drives each (~12 s here, load 12-14)
def test_page_speaks_chats_and_shows_errors(spoken_server, server, tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    shots = _shots(tmp_path)
    with sync_playwright() as p:
        browser = _browser(p, chromium)
        try:
            page = browser.new_page()
            offline = []  # every request the page makes must go to this server
            page.on("request", lambda r: offline.append(r.url))
            # a speech server: type text, hear it streamed
            page.goto(server.url + "/")
            page.fill("#key", KEY)
            page.dispatch_event("#key", "change")
            page.wait_for_selector("body[data-ready='1']", timeout=60_000)
            assert page.is_visible("#speech") and not page.is_visible("#chat")
            assert page.locator("#voice option").count() >= 2  # the folder's voices and the default
            groups = page.eval_on_selector_all("#voice optgroup", "gs => gs.map(g => g.label)")
            assert groups == ["Recordings", "X-vectors", "Built-in"]  # alice.wav, bob.npy, the default
            assert "cloned voices; it takes no instruction" in page.inner_text("#offer")
            assert not page.is_visible("#instruction-field")
            page.fill("#text", "Hello from the page.")
            page.click("#speak")
            page.wait_for_function("window.kztts.stats.bytes > 0 && window.kztts.stats.played > 0", timeout=120_000)
            stats = page.evaluate("window.kztts.stats")
            assert stats["bytes"] > 0 and stats["played"] >= 1 and stats["firstAudioMs"] > 0
            page.fill("#text", " ")  # a bad input: the server's own message is shown
            page.click("#speak")
            page.wait_for_function("document.getElementById('error').textContent.length > 0", timeout=60_000)
            assert "'input' is empty" in page.inner_text("#error")
            page.screenshot(path=str(shots / "page-speech.png"))
            # a spoken-chat server: the transcript shows while the reply is spoken
            page.goto(spoken_server.url + "/")
            page.wait_for_selector("body[data-ready='1']", timeout=60_000)
            assert page.is_visible("#chat") and page.is_visible("#voice-field")  # the picker drives audio.voice
            assert "replies spoken by Base" in page.inner_text("#offer")
            page.fill("#message", "Say something.")
            page.select_option("#voice", "alice")
            with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as sent:
                page.click("#send")
            assert json.loads(sent.value.post_data)["audio"] == {"voice": "alice", "format": "pcm16"}
            # the whole reply received (the page's done), so the line shown is the whole transcript
            page.wait_for_function("window.kztts.stats.done && window.kztts.stats.transcript.length > 0 && "
                                   "window.kztts.stats.played > 0", timeout=180_000)
            shown = page.inner_text(".assistant")
            assert shown and shown.strip() == page.evaluate("window.kztts.stats.transcript").strip()
            page.fill("#message", "")
            page.click("#send")
            assert "type a message first" in page.inner_text("#error")
            page.screenshot(path=str(shots / "page-chat.png"), full_page=True)
            print(f"\npage screenshots: {shots / 'page-speech.png'}, {shots / 'page-chat.png'}")
            hosts = {u.split("/")[2] for u in offline}
            assert hosts <= {server.url.split("/")[2], spoken_server.url.split("/")[2]}, hosts
        finally:
            browser.close()


LIVE_TEXT = "Spoken while it is typed."


@pytest.mark.slow  # a real browser: Debian's chromium types into the page (~15 s here)
def test_page_speaks_while_typing(server, tts, voices, tmp_path):
    """The page's live box sends each keystroke's text over /v1/audio/speech/stream as it is typed (a browser's
    WebSocket carries the key in the setup); the audio it receives is ``TTS.stream_text`` of the typed text, and
    it arrives before the typing is done."""
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    shots = _shots(tmp_path)
    with sync_playwright() as p:
        browser = _browser(p, chromium)
        try:
            page = browser.new_page()
            frames: list[bytes] = []
            sent: list[str] = []

            def on_socket(ws):
                ws.on("framereceived", lambda payload: frames.append(payload) if isinstance(payload, bytes) else None)
                ws.on("framesent", lambda payload: sent.append(payload))

            page.on("websocket", on_socket)
            page.goto(server.url + "/")
            page.fill("#key", KEY)
            page.dispatch_event("#key", "change")
            page.wait_for_selector("body[data-ready='1']", timeout=60_000)
            page.select_option("#voice", "default")
            page.click("#live")
            page.keyboard.type(LIVE_TEXT, delay=80)
            audio_while_typing = page.evaluate("window.kztts.stats.bytes")
            page.keyboard.press("Enter")
            page.wait_for_function("window.kztts.stats.done && window.kztts.stats.played > 0", timeout=180_000)
            assert "first audio" in page.inner_text("#live-state")
            page.screenshot(path=str(shots / "page-live.png"))
            print(f"\npage screenshot: {shots / 'page-live.png'}")
        finally:
            browser.close()
    texts = [json.loads(m) for m in sent]
    assert texts[0]["type"] == "setup" and texts[0]["api_key"] == KEY and texts[-1] == {"type": "end"}
    typed = "".join(m["text"] for m in texts if m["type"] == "text")
    assert typed == LIVE_TEXT and sum(m["type"] == "text" for m in texts) > 5  # keystroke by keystroke
    want = np.concatenate(list(tts.stream_text([LIVE_TEXT], voices["default"])))
    assert b"".join(frames) == pcm16(want)
    assert audio_while_typing > 0  # heard before the typing was done


PAGE_TEXT = "Hello from a preset speaker."


def _page_speaks(page, server: Server) -> tuple[dict, bytes]:
    """Click Speak; the body the page sent and the PCM that arrived, once the page has received it all and played
    some of it (its own count of bytes equals what arrived)."""
    with page.expect_response(lambda r: r.url == server.url + "/v1/audio/speech") as answer:
        page.click("#speak")
    page.wait_for_function("window.kztts.stats.done && window.kztts.stats.played > 0", timeout=180_000)
    response = answer.value
    assert response.status == 200
    got = response.body()
    assert got and page.evaluate("window.kztts.stats.bytes") == len(got)
    return json.loads(response.request.post_data), got


@pytest.mark.slow  # a real browser: three servers (CustomVoice 1.7B, 0.6B, VoiceDesign) start (~12 s here, load 11-14)
def test_page_offers_what_each_kind_takes(custom_voice_bundle, custom_voice_06_bundle, voice_design_bundle,
                                          tmp_path_factory, tmp_path):
    """CustomVoice 1.7B: the page picks a preset speaker and sends an instruction; the audio it hears is the server's
    own answer to the same request. CustomVoice 0.6B: speakers, no instruction field. VoiceDesign: a voice
    description, no voice picker."""
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    shots = _shots(tmp_path)
    logs = tmp_path_factory.mktemp("log")
    # a short Talker context keeps each random-weight utterance short (the page asks no max_frames)
    cv = start_server(custom_voice_bundle, logs / "cv.log", "--context", "96")
    servers = [cv]
    try:
        servers.append(start_server(custom_voice_06_bundle, logs / "cv06.log", "--context", "96"))
        servers.append(start_server(voice_design_bundle, logs / "vd.log", "--context", "96"))
        cv06, vd = servers[1:]
        with sync_playwright() as p:
            browser = _browser(p, chromium)
            try:
                page = browser.new_page()
                offline = []  # every request the page makes must go to these servers
                page.on("request", lambda r: offline.append(r.url))
                # CustomVoice 1.7B: preset speakers grouped, dialects shown; an instruction sets the style
                page.goto(cv.url + "/")
                page.wait_for_selector("body[data-ready='1']", timeout=60_000)
                assert page.is_visible("#voice-field") and page.is_visible("#instruction-field")
                labels = page.inner_text("#voice-label"), page.inner_text("#instruction-label")
                assert labels == ("speaker", "instruction")
                assert "CustomVoice 1.7B: preset speakers; an optional instruction" in page.inner_text("#offer")
                groups = page.eval_on_selector_all("#voice optgroup", "gs => gs.map(g => g.label)")
                assert groups == ["Preset speakers"]
                options = page.eval_on_selector_all("#voice option", "os => os.map(o => [o.value, o.textContent])")
                assert len(options) == 9 and ["dylan", "dylan (Beijing dialect)"] in options, options
                page.select_option("#voice", "eric")
                page.fill("#instructions", "Very happy.")
                page.fill("#text", PAGE_TEXT)
                sent, heard = _page_speaks(page, cv)
                assert sent == {"model": sent["model"], "input": PAGE_TEXT, "voice": "eric",
                                "instructions": "Very happy.", "response_format": "pcm", "stream": True}
                status, _, want = raw(cv, "POST", "/v1/audio/speech", sent, key=None)
                assert status == 200 and heard == want  # the server's own answer to the same request, byte for byte
                plain = raw(cv, "POST", "/v1/audio/speech", {k: v for k, v in sent.items() if k != "instructions"},
                            key=None)[2]
                assert plain != heard  # the instruction reached the model
                assert "all received" in page.inner_text("#status")
                page.screenshot(path=str(shots / "page-custom-voice.png"))
                page.fill("#text", " ")  # a bad input: the server's own message is shown
                page.click("#speak")
                page.wait_for_function("document.getElementById('error').textContent.length > 0", timeout=60_000)
                assert "'input' is empty" in page.inner_text("#error")
                # CustomVoice 0.6B: speakers, and no instruction field (kztts refuses what qwen-tts would drop)
                page.goto(cv06.url + "/")
                page.wait_for_selector("body[data-ready='1']", timeout=60_000)
                assert page.is_visible("#voice-field") and not page.is_visible("#instruction-field")
                assert "CustomVoice 0.6B: preset speakers; it takes no instruction" in page.inner_text("#offer")
                # VoiceDesign: no voice to pick, the instruction describes it
                page.goto(vd.url + "/")
                page.wait_for_selector("body[data-ready='1']", timeout=60_000)
                assert not page.is_visible("#voice-field") and page.is_visible("#instruction-field")
                assert page.inner_text("#instruction-label") == "voice description"
                page.fill("#instructions", "A deep, calm voice.")
                page.fill("#text", PAGE_TEXT)
                sent, heard = _page_speaks(page, vd)
                assert (sent["voice"], sent["instructions"]) == ("default", "A deep, calm voice.")
                assert heard == raw(vd, "POST", "/v1/audio/speech", sent, key=None)[2]
                hosts = {u.split("/")[2] for u in offline}
                assert hosts <= {s.url.split("/")[2] for s in servers}, hosts
            finally:
                browser.close()
    finally:
        codes = [stop(s) for s in servers]
        assert codes == [0] * len(servers), [s.tail() for s in servers]
