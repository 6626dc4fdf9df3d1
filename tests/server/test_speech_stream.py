"""``/v1/audio/speech/stream`` with the ``websockets`` client against a real ``kztts serve``: text sent as it is
written comes back as pcm16 while it is spoken, equal to ``TTS.stream_text`` of the same text (several clients at
once, in the batched rows); and each bad input (a malformed or unknown message, text after the end, an empty
text, a bad setup) is one error event with OpenAI's error body, after which the server goes on serving."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from support import KEY, start_server, stop
from kztts.server.audio_out import pcm16
from kztts.server.speech_stream import PATH

websockets_sync = pytest.importorskip("websockets.sync.client")

TEXTS = ["Sent word by word over a socket, spoken as it comes.", "A second client, at the same time."]


@pytest.fixture(scope="module")
def server(equal_bundle, tmp_path_factory):
    s = start_server(equal_bundle, tmp_path_factory.mktemp("log") / "ws.log", "--batch", "2", "--queue", "4",
                     "--context", "128", "--api-key", KEY)
    yield s
    assert stop(s) == 0, s.tail()


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + PATH


def session(server, setup: dict, messages: list, pause: float = 0.0) -> tuple[list[dict], bytes]:
    """One session: the setup, then ``messages`` (dicts sent as JSON, str sent raw) ``pause`` s apart; returns the
    JSON events and the audio bytes received."""
    events, audio = [], bytearray()
    with websockets_sync.connect(ws_url(server), additional_headers={"Authorization": f"Bearer {KEY}"},
                                 open_timeout=30, close_timeout=5) as ws:
        ws.send(json.dumps({"type": "setup", **setup}))

        def send_all():
            for m in messages:
                time.sleep(pause)
                try:
                    ws.send(m if isinstance(m, str) else json.dumps(m))
                except Exception:  # the server closed the session (an error ends it)
                    return

        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        try:
            for message in ws:
                if isinstance(message, bytes):
                    audio += message
                else:
                    events.append(json.loads(message))
        except Exception:
            pass
        sender.join(5)
    return events, bytes(audio)


def words(text: str) -> list[dict]:
    w = text.split(" ")
    return [{"type": "text", "text": p} for p in [w[0]] + [" " + x for x in w[1:]]] + [{"type": "end"}]


def test_text_written_over_a_socket_is_spoken_as_stream_text_speaks_it(server, equal_bundle):
    from kztts.core.audio import synthetic_voice
    from kztts.tts.tts import TTS

    setup = {"model": "tts-1", "language": "english", "seed": 3, "max_frames": 24}
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda t: session(server, setup, words(t), pause=0.02), TEXTS))
    tts = TTS(equal_bundle, context=128)
    voice = tts.voice_from_wav(synthetic_voice(), 24000)  # the server's default voice
    for text, (events, audio) in zip(TEXTS, runs):
        kinds = [e["type"] for e in events]
        assert kinds == ["ready", "first_audio", "done"], events
        assert events[0]["sample_rate"] == 24000 and events[1]["ms"] > 0
        w = text.split(" ")
        alone = np.concatenate(list(tts.stream_text([w[0]] + [" " + x for x in w[1:]], voice, language="english",
                                                    seed=3, max_frames=24)))
        assert audio == pcm16(alone)
        assert events[2]["frames"] == 24


@pytest.mark.parametrize("setup,messages,status,code", [
    ({"model": "tts-1"}, ["not json"], 400, "invalid_message"),
    ({"model": "tts-1"}, [{"type": "speak"}], 400, "invalid_message"),
    ({"model": "tts-1", "max_frames": 8}, [{"type": "text", "text": "Hi."}, {"type": "end"},
                                           {"type": "text", "text": " More."}], 400, "text_after_end"),
    ({"model": "tts-1"}, [{"type": "end"}], 400, "invalid_value"),
    ({"model": "tts-1", "input": "Hello"}, [], 400, "unknown_parameter"),
    ({"model": "tts-1", "response_format": "mp3"}, [], 400, None),
    ({"model": "nope"}, [], 404, "model_not_found"),
], ids=["not-json", "unknown-type", "text-after-end", "empty-text", "input-in-setup", "mp3", "unknown-model"])
def test_bad_input_is_one_error_event_and_the_server_goes_on(server, setup, messages, status, code):
    events, _ = session(server, setup, messages)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and events[-1] is errors[0], events
    assert set(errors[0]["error"]) >= {"message", "type", "param", "code"}
    if code:
        assert errors[0]["error"]["code"] == code, errors[0]
    # the server goes on
    events, audio = session(server, {"model": "tts-1", "max_frames": 4}, words("Still here."))
    assert [e["type"] for e in events] == ["ready", "first_audio", "done"] and audio


def test_a_client_that_leaves_frees_its_row(server):
    import http.client

    with websockets_sync.connect(ws_url(server), additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "setup", "model": "tts-1"}))
        ws.send(json.dumps({"type": "text", "text": "A text that never ends"}))
        assert json.loads(ws.recv(timeout=60))["type"] == "ready"
    deadline = time.monotonic() + 30
    while True:
        conn = http.client.HTTPConnection(*server.host_port, timeout=10)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        if health["running"] == 0:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.1)


def test_the_key_on_the_handshake_or_in_the_setup(server):
    """A wrong key on the handshake is refused there; without one (a browser's WebSocket sends none) the setup must
    carry it as ``api_key``."""
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus, match="403"):
        websockets_sync.connect(ws_url(server), open_timeout=10, additional_headers={"Authorization": "Bearer no"})
    for setup, ok in (({"model": "tts-1"}, False), ({"model": "tts-1", "api_key": "wrong"}, False),
                      ({"model": "tts-1", "api_key": KEY, "max_frames": 3}, True)):
        with websockets_sync.connect(ws_url(server), open_timeout=10) as ws:
            ws.send(json.dumps({"type": "setup", **setup}))
            for m in words("Keyed."):
                ws.send(json.dumps(m))
            first = json.loads(ws.recv(timeout=60))
            if ok:
                assert first["type"] == "ready"
            else:
                assert first["type"] == "error" and first["error"]["code"] == "invalid_api_key", first
