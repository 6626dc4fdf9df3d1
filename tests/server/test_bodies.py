"""kztts.server.bodies: the request bodies checked into what the engines run. OpenAI's keys and defaults, kztts's
own keys beside them, and every refusal an ``ApiError`` naming the key (the same bodies over HTTP:
tests/server/test_serve.py)."""
from __future__ import annotations

import pytest

from kztts.server.bodies import (
    SPEECH_MODEL_ALIASES,
    VOICE_DEFAULT,
    Limits,
    chat_body,
    parse_json,
    speech_body,
)
from kztts.server.errors import ApiError

LIMITS = Limits(max_input_chars=40, max_frames=100, max_tokens=64, max_body_bytes=1000)


def refused(check, body: dict, status: int = 400, *, code: str, param: str | None = None) -> str:
    with pytest.raises(ApiError) as info:
        check(body)
    error = info.value
    assert (error.status, error.code) == (status, code), error.body()
    if param is not None:
        assert error.param == param, error.body()
    return error.message


def speech(**body):
    return speech_body({"model": "tts-1", "input": "Hello.", **body}, LIMITS)


# ---------------------------------------------------------------- JSON
def test_parse_json_takes_an_object_only():
    assert parse_json(b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert "line 1 column 2" in refused(parse_json, b"{bad", code="invalid_json")
    assert "not valid JSON" in refused(parse_json, b"\xff\xfe{}", code="invalid_json")
    assert "must be a JSON object, got list" in refused(parse_json, b"[1, 2]", code="invalid_json")


# ---------------------------------------------------------------- speech
def test_speech_defaults_are_openais():
    body = speech()
    assert (body.model, body.input, body.voice, body.response_format) == ("tts-1", "Hello.", VOICE_DEFAULT, "mp3")
    assert (body.stream, body.sse, body.language, body.seed, body.greedy, body.max_frames, body.streaming_text) == \
        (False, False, None, 0, False, None, False)
    assert body.overrides == {} and "gpt-4o-mini-tts" in SPEECH_MODEL_ALIASES
    assert "'model' is required" in refused(lambda b: speech_body(b, LIMITS), {"input": "hi"},
                                            code="missing_required_parameter", param="model")


def test_speech_streams_pcm_and_what_stream_format_asks():
    assert speech(response_format="pcm").stream is True  # raw samples: streamed unless asked otherwise
    assert speech(response_format="pcm", stream=False).stream is False
    wav = speech(response_format="wav", stream_format="audio")
    assert wav.stream and not wav.sse
    sse = speech(response_format="pcm", stream_format="sse")
    assert sse.stream and sse.sse
    assert speech(response_format="wav", stream=True).stream
    assert "contradicts" in refused(lambda b: speech(**b), {"response_format": "pcm", "stream": False,
                                                            "stream_format": "sse"}, code="invalid_value",
                                    param="stream")
    assert "sent whole, not streamed" in refused(lambda b: speech(**b), {"response_format": "flac", "stream": True},
                                                 code="invalid_value", param="stream")
    assert "expected one of audio, sse" in refused(lambda b: speech(**b), {"stream_format": "websocket"},
                                                   code="invalid_value", param="stream_format")


def test_speech_keys_of_kztts_and_the_sampling_overrides():
    body = speech(voice={"id": "alice"}, language="french", seed=7, greedy=True, max_frames=100, streaming_text=True,
                  temperature=0.7, cp_top_k=5, top_p=None)
    assert (body.voice, body.language, body.seed, body.greedy, body.max_frames, body.streaming_text) == \
        ("alice", "french", 7, True, 100, True)
    # keyed like the environment variables the settings read, and named as the body named them
    assert body.overrides == {"KZTTS_TEMP": 0.7, "KZTTS_CP_TOPK": 5}
    assert body.override_names == {"KZTTS_TEMP": "'temperature'", "KZTTS_CP_TOPK": "'cp_top_k'"}
    assert speech(speed=1.0, instructions="").input == "Hello."  # OpenAI keys at their defaults
    # instructions pass through (the bundle's kind takes or refuses them: tests/server/test_serve_kinds.py)
    assert speech(instructions="Very happy.").instructions == "Very happy." and speech().instructions is None


@pytest.mark.parametrize("body, status, code, param", [
    ({"input": None}, 400, "missing_required_parameter", "input"),
    ({"input": "   "}, 400, "empty_input", "input"),
    ({"input": "x" * 41}, 413, "input_too_long", "input"),
    ({"input": 5}, 400, "invalid_type", "input"),
    ({"voice": 3}, 400, "invalid_type", "voice"),
    ({"response_format": "aac"}, 400, "invalid_value", "response_format"),
    ({"speed": 1.5}, 400, "unsupported_parameter", "speed"),
    ({"speed": "fast"}, 400, "invalid_type", "speed"),
    ({"instructions": 5}, 400, "invalid_type", "instructions"),
    ({"max_frames": 0}, 400, "invalid_value", "max_frames"),
    ({"max_frames": 101}, 400, "above_limit", "max_frames"),
    ({"max_frames": 2.5}, 400, "invalid_type", "max_frames"),
    ({"seed": True}, 400, "invalid_type", "seed"),
    ({"greedy": "yes"}, 400, "invalid_type", "greedy"),
    ({"temperature": "hot"}, 400, "invalid_type", "temperature"),
    ({"cp_top_k": False}, 400, "invalid_type", "cp_top_k"),
    ({"sped": 1}, 400, "unknown_parameter", "sped"),
])
def test_speech_refusals_name_the_key(body, status, code, param):
    refused(lambda b: speech(**b), body, status, code=code, param=param)


# ---------------------------------------------------------------- chat
def chat(**body):
    return chat_body({"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body})


def test_chat_defaults_and_messages():
    body = chat()
    assert (body.model, body.messages, body.max_tokens, body.temperature, body.top_p, body.top_k) == \
        ("m", [{"role": "user", "content": "Hi"}], None, None, None, None)
    assert (body.repetition_penalty, body.seed, body.greedy, body.stream, body.include_usage) == \
        (None, 0, False, False, False)
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Bon"}, {"type": "text", "text": "jour"}]},
                {"role": "assistant", "content": "Salut."}, {"role": "user", "content": "?", "name": "ann"}]
    assert chat(messages=messages).messages == [  # OpenAI's developer is ChatML's system; text parts joined
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bonjour"},
        {"role": "assistant", "content": "Salut."}, {"role": "user", "content": "?"}]
    body = chat(max_tokens=9, max_completion_tokens=5, temperature=0, top_p=1, top_k=0, repetition_penalty=1.1,
                seed=3, greedy=True, stream=True, stream_options={"include_usage": True})
    assert (body.max_tokens, body.temperature, body.top_p, body.top_k, body.repetition_penalty) == (5, 0.0, 1.0, 0, 1.1)
    assert (body.seed, body.greedy, body.stream, body.include_usage) == (3, True, True, True)
    assert chat(max_tokens=9).max_tokens == 9
    # OpenAI keys kztts does not implement, at their defaults
    assert chat(n=1, presence_penalty=0, logprobs=False, stop=None, tools=[], user="u", store=True,
                response_format={"type": "text"}, modalities=["text"]).model == "m"


@pytest.mark.parametrize("body, code, param", [
    ({"messages": None}, "missing_required_parameter", "messages"),
    ({"messages": "hi"}, "invalid_type", "messages"),
    ({"messages": []}, "empty_input", "messages"),
    ({"messages": ["hi"]}, "invalid_type", "messages[0]"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "invalid_value", "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": 1}]}]}, "unsupported_parameter",
     "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "invalid_value", "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "invalid_type", "messages[0].content"),
    ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " "}]}, "empty_input",
     "messages"),
    ({"max_tokens": 0}, "invalid_value", "max_tokens"),
    ({"temperature": 2.5}, "invalid_value", "temperature"),
    ({"temperature": "hot"}, "invalid_type", "temperature"),
    ({"top_p": 0}, "invalid_value", "top_p"),
    ({"stream_options": "usage"}, "invalid_type", "stream_options"),
    ({"n": 2}, "unsupported_parameter", "n"),
    ({"logit_bias": {"1": 5}}, "unsupported_parameter", "logit_bias"),
    ({"input": "hi"}, "unknown_parameter", "input"),
])
def test_chat_refusals_name_the_key(body, code, param):
    refused(lambda b: chat(**b), body, code=code, param=param)
