"""One voice rule on every server route (``TTS.default_voice``), against a real ``kztts serve`` of a CustomVoice
bundle: a request that names no voice is spoken by the first preset speaker, as ``kztts synth`` without
``--speaker`` speaks it: ``POST /v1/audio/speech``, the WebSocket ``/v1/audio/speech/stream``, a spoken chat
completion, and ``GET /v1/audio/voices`` (the page at ``/`` selects the voice marked default). Base bundles' default
(the built-in voice) on these routes: tests/server/test_serve.py, test_speech_stream.py."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from support import KEY, int16_of_wav, raw, start_server, stop
from kztts.server.audio_out import pcm16
from kztts.server.speech_stream import PATH

websockets_sync = pytest.importorskip("websockets.sync.client")

TEXT = "Nobody named a voice."
FIRST = "aiden"  # the tiny CustomVoice checkpoint's first preset speaker, as the released checkpoints list it


@pytest.fixture(scope="module")
def cv_server(custom_voice_bundle, tmp_path_factory):
    s = start_server(custom_voice_bundle, tmp_path_factory.mktemp("log") / "cv.log", "--api-key", KEY)
    yield s
    assert stop(s) == 0, s.tail()


@pytest.fixture(scope="module")
def cv(custom_voice_bundle):
    from kztts.tts.tts import TTS

    return TTS(custom_voice_bundle)


def test_speech_without_a_voice_is_the_first_preset_speaker(cv_server, cv):
    assert cv.kind.default_speaker == FIRST
    status, _, body = raw(cv_server, "POST", "/v1/audio/speech", {"model": "tts-1", "input": TEXT, "response_format":
                                                                  "wav", "seed": 2, "max_frames": 10})
    assert status == 200, body[:300]
    want = cv.synthesize(TEXT, speaker=FIRST, seed=2, max_frames=10).samples
    assert np.array_equal(int16_of_wav(body), np.frombuffer(pcm16(want), "<i2"))
    status, _, body = raw(cv_server, "GET", "/v1/audio/voices")
    marked = [v["id"] for v in json.loads(body)["data"] if v["default"]]
    assert status == 200 and marked == [FIRST]  # what the page selects first


def test_websocket_without_a_voice_is_the_first_preset_speaker(cv_server, cv):
    audio = bytearray()
    url = cv_server.url.replace("http://", "ws://") + PATH
    with websockets_sync.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "setup", "model": "tts-1", "seed": 1, "max_frames": 10}))
        ws.send(json.dumps({"type": "text", "text": TEXT}))
        ws.send(json.dumps({"type": "end"}))
        events = []
        for message in ws:
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(json.loads(message))
                if events[-1]["type"] in ("done", "error"):
                    break
    assert events[-1]["type"] == "done", events
    want = np.concatenate(list(cv.stream_text([TEXT], speaker=FIRST, seed=1, max_frames=10)))
    assert bytes(audio) == pcm16(want)


def test_a_spoken_chat_reply_without_a_voice_is_the_first_preset_speaker(chat_bundle, custom_voice_bundle,
                                                                         tmp_path_factory):
    s = start_server(chat_bundle, tmp_path_factory.mktemp("log") / "chat.log", "--tts", str(custom_voice_bundle),
                     "--api-key", KEY)
    try:
        body = {"model": chat_bundle.name, "messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 8, "seed": 3,
                "modalities": ["text", "audio"]}
        got = {}
        for name, audio in (("none", {"format": "wav"}), ("first", {"voice": FIRST, "format": "wav"})):
            status, _, data = raw(s, "POST", "/v1/chat/completions", {**body, "audio": audio})
            assert status == 200, data[:300]
            got[name] = base64.b64decode(json.loads(data)["choices"][0]["message"]["audio"]["data"])
    finally:
        assert stop(s) == 0, s.tail()
    assert len(int16_of_wav(got["none"])) > 0 and got["none"] == got["first"]
