"""kztts.server.app: the HTTP API as an ASGI app, called here directly (no socket, no client library) over services
opened on the tiny bundles. The key guards every route but ``/health``; unknown routes, methods, models and bodies
too large are OpenAI errors; a refusal found after the job was queued is still a status; a bug is a 500 with its
traceback in the log and the server goes on; draining refuses work; a client that leaves cancels its job; one
access-log line and the request metrics per request. Whole and streamed answers equal the model's own (through
sockets and the official client: tests/server/test_serve.py)."""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time

import numpy as np
import pytest

from kztts.core.audio import synthetic_voice
from kztts.server.app import ENDPOINTS, build_app
from kztts.server.audio_out import encode, pcm16
from kztts.server.bodies import Limits
from kztts.server.service import ServeOptions, Service

KEY = "app-key"
LIMITS = Limits(max_tokens=48, max_body_bytes=4096)


class Answer:
    def __init__(self, messages: list[dict]):
        start = next(m for m in messages if m["type"] == "http.response.start")
        self.status = start["status"]
        self.headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
        self.chunks = [m.get("body", b"") for m in messages if m["type"] == "http.response.body"]
        self.body = b"".join(self.chunks)

    def json(self):
        return json.loads(self.body)

    def error(self) -> dict:
        error = self.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]
        return error


def call(app, method: str, path: str, body: bytes | dict = b"", *, key: str | None = KEY, length: bool = True,
         leave_after: int | None = None) -> Answer:
    """One request through the ASGI app. ``leave_after``: the client disconnects after that many body chunks."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    headers = [(b"content-type", b"application/json")]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if length:
        headers.append((b"content-length", str(len(data)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {}}
    messages: list[dict] = []

    async def main():
        gone, requested = asyncio.Event(), [False]

        async def receive():
            if not requested[0]:
                requested[0] = True
                return {"type": "http.request", "body": data, "more_body": False}
            await gone.wait()  # the client stays until it leaves
            return {"type": "http.disconnect"}

        async def send(message):
            messages.append(message)
            chunks = sum(1 for m in messages if m["type"] == "http.response.body" and m.get("body"))
            if leave_after is not None and chunks >= leave_after:
                gone.set()

        await asyncio.wait_for(app(scope, receive, send), 120)

    asyncio.run(main())
    return Answer(messages)


@pytest.fixture(scope="module")
def speech(equal_bundle):
    service = Service.open(ServeOptions(bundle=equal_bundle, api_key=KEY, batch=2, queue=4, context=128,
                                        limits=LIMITS))
    service.start()
    yield service
    service.close()


@pytest.fixture(scope="module")
def speech_app(speech):
    return build_app(speech)


@pytest.fixture(scope="module")
def chat(chat_bundle):
    service = Service.open(ServeOptions(bundle=chat_bundle, batch=2, limits=LIMITS))
    service.start()
    yield service
    service.close()


@pytest.fixture(scope="module")
def chat_app(chat):
    return build_app(chat)


@pytest.fixture(scope="module")
def voice(tts):
    return tts.voice_from_wav(synthetic_voice(), 24000)  # the server's default voice


def metric(service, name: str, **labels) -> float:
    return service.metrics.registry.get_sample_value(name, labels or None) or 0.0


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# ---------------------------------------------------------------- the key, routes, models, health
def test_the_key_guards_every_route_but_health(speech, speech_app):
    for key, words in ((None, "missing API key: send 'Authorization: Bearer KEY'"), ("wrong", "incorrect API key")):
        answer = call(speech_app, "GET", "/v1/models", key=key)
        assert answer.status == 401 and answer.error()["message"] == words and answer.error()["code"] == "invalid_api_key"
    health = call(speech_app, "GET", "/health", key=None)
    assert health.status == 200 and health.json() == {"status": "ready", "model": speech.model_id, "kind": "tts",
                                                      "running": 0, "waiting": 0, "batch": 2,
                                                      "mode": speech.engine.mode}


def test_models_listing_and_cards(speech, speech_app, chat, chat_app):
    (card,) = call(speech_app, "GET", "/v1/models").json()["data"]
    assert card["id"] == speech.model_id and (card["object"], card["owned_by"], card["kind"]) == ("model", "kztts",
                                                                                                  "speech")
    assert isinstance(card["created"], int)
    # kztts's field: what the bundle takes, so that a client (the page at /) shows a voice picker or an instruction
    assert card["tts"] == {"kind": "base", "label": speech.model.kind.label, "takes_instruction": False}
    assert call(speech_app, "GET", f"/v1/models/{speech.model_id}").json() == card
    other = call(speech_app, "GET", "/v1/models/gpt-4")
    assert other.status == 404 and other.error()["code"] == "model_not_found"
    chat_card = call(chat_app, "GET", "/v1/models").json()["data"][0]
    assert chat_card["kind"] == "chat" and "tts" not in chat_card  # an LM alone speaks nothing
    answer = call(chat_app, "GET", "/v1/audio/voices")
    assert answer.status == 404 and "it has no voices" in answer.error()["message"]
    assert call(speech_app, "GET", "/v1/audio/voices").json()["data"][0]["id"] == "default"


def test_unknown_routes_and_methods(speech_app):
    answer = call(speech_app, "GET", "/v2/nothing")
    assert answer.status == 404 and answer.error() == {
        "message": f"no route /v2/nothing; the endpoints are {', '.join(ENDPOINTS)}", "type": "invalid_request_error",
        "param": None, "code": "not_found"}
    answer = call(speech_app, "GET", "/v1/audio/speech")
    assert answer.status == 405 and answer.error()["message"] == "GET is not allowed on /v1/audio/speech"


def test_a_body_past_the_limit_is_refused_before_or_while_it_is_read(speech_app):
    big = b"{" + b" " * 5000 + b"}"
    declared = call(speech_app, "POST", "/v1/audio/speech", big)
    assert declared.status == 413 and declared.error()["message"] == "the request body has 5002 bytes; the limit is 4096"
    undeclared = call(speech_app, "POST", "/v1/audio/speech", big, length=False)
    assert undeclared.status == 413 and "passes the limit of 4096 bytes" in undeclared.error()["message"]


# ---------------------------------------------------------------- speech
def test_speech_whole_and_streamed_is_the_models_own(speech_app, tts, voice):
    body = {"model": "tts-1", "input": "Hello from the app.", "seed": 4, "max_frames": 12}
    whole = call(speech_app, "POST", "/v1/audio/speech", {**body, "response_format": "wav"})
    alone = tts.synthesize(body["input"], voice, seed=4, max_frames=12)
    assert whole.status == 200 and whole.headers["content-type"] == "audio/wav"
    assert whole.body == encode(alone.samples, 24000, "wav") and whole.headers["x-kztts-frames"] == str(alone.frames)
    streamed = call(speech_app, "POST", "/v1/audio/speech", {**body, "response_format": "pcm", "seed": 5})
    chunks = list(tts.stream(body["input"], voice, seed=5, max_frames=12))
    assert streamed.status == 200 and streamed.headers["content-type"] == "audio/pcm"
    assert streamed.body == pcm16(np.concatenate(chunks)) and len([c for c in streamed.chunks if c]) == len(chunks)
    sse = call(speech_app, "POST", "/v1/audio/speech", {**body, "response_format": "pcm", "seed": 5,
                                                        "stream_format": "sse"})
    events = [json.loads(line[6:]) for line in sse.body.decode().splitlines() if line.startswith("data: ")]
    assert sse.headers["content-type"].startswith("text/event-stream")
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == streamed.body
    tokens = len(tts.tokenizer.encode(body["input"]))  # the text's own tokens (5), not 0
    assert tokens > 0 and events[-1] == {"type": "speech.audio.done", "usage": {
        "input_tokens": tokens, "output_tokens": 12, "total_tokens": tokens + 12}}
    # sse without a response_format: pcm, the format every stream sends (OpenAI's default mp3 is sent whole only)
    bare = call(speech_app, "POST", "/v1/audio/speech", {**body, "seed": 5, "stream_format": "sse"})
    assert bare.status == 200 and bare.body == sse.body


def test_refusals_found_after_the_body_are_statuses(speech_app, chat_app, chat):
    base = {"model": "tts-1", "input": "Hi."}
    answer = call(speech_app, "POST", "/v1/audio/speech", {**base, "voice": "nobody"})
    assert answer.status == 404 and answer.error()["code"] == "voice_not_found"
    answer = call(speech_app, "POST", "/v1/audio/speech", {**base, "language": "klingon"})  # the engine's refusal
    assert answer.status == 400 and "klingon" in answer.error()["message"]
    answer = call(speech_app, "POST", "/v1/audio/speech", {**base, "model": "whisper-1"})
    assert answer.status == 404 and "use " in answer.error()["message"] and "tts-1" in answer.error()["message"]
    answer = call(speech_app, "POST", "/v1/chat/completions", {"model": "tts-1", "messages": [
        {"role": "user", "content": "hi"}]})
    assert answer.status == 404 and "this server serves a speech model" in answer.error()["message"]
    answer = call(chat_app, "POST", "/v1/audio/speech", base, key=None)
    assert answer.status == 404 and "this server serves a chat model" in answer.error()["message"]


def test_a_bug_is_a_500_with_its_traceback_logged_and_the_server_goes_on(speech, speech_app, monkeypatch, caplog):
    def broken(request, stream):
        raise RuntimeError("a bug in prepare")

    monkeypatch.setattr(speech.engine, "prepare", broken)
    with caplog.at_level(logging.ERROR, logger="kztts.server.app"):
        answer = call(speech_app, "POST", "/v1/audio/speech", {"model": "tts-1", "input": "Hi."})
    assert answer.status == 500 and answer.error()["code"] == "internal_error"
    assert "the traceback is in the server log" in answer.error()["message"]
    (record,) = [r for r in caplog.records if r.name == "kztts.server.app"]
    assert record.getMessage() == "bug while answering POST /v1/audio/speech" and "a bug in prepare" in caplog.text
    monkeypatch.undo()
    assert call(speech_app, "GET", "/health", key=None).status == 200
    assert call(speech_app, "POST", "/v1/audio/speech", {"model": "tts-1", "input": "Hi.", "max_frames": 3}).status == 200


def test_draining_refuses_work_but_not_listings(speech, speech_app, monkeypatch):
    monkeypatch.setattr(speech.scheduler, "draining", True)
    answer = call(speech_app, "POST", "/v1/audio/speech", {"model": "tts-1", "input": "Hi."})
    assert answer.status == 503 and answer.error()["code"] == "draining"
    assert answer.headers["retry-after"] == "5" and answer.headers["connection"] == "close"
    health = call(speech_app, "GET", "/health", key=None)
    assert health.status == 503 and health.json()["status"] == "draining"
    assert call(speech_app, "GET", "/v1/models").status == 200


def test_a_client_that_leaves_mid_stream_frees_its_row_and_is_logged(speech, speech_app, caplog):
    cancelled = metric(speech, "kztts_cancelled_total")
    with caplog.at_level(logging.INFO, logger="kztts.server.access"):
        answer = call(speech_app, "POST", "/v1/audio/speech", {"model": "tts-1", "input": "Hold on.", "max_frames": 600,
                                                               "response_format": "pcm"}, leave_after=1)
    assert answer.status == 200 and len(answer.body) < 600 * 1920 * 2
    wait_for(lambda: speech.scheduler.counts() == (0, 0), "the row to be freed")
    wait_for(lambda: metric(speech, "kztts_cancelled_total") == cancelled + 1, "the cancel to be counted")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kztts.server.access"]
    assert line.startswith('127.0.0.1:50000 "POST /v1/audio/speech" 200 ') and line.endswith(" s (client left)")


def test_one_access_log_line_and_the_request_metrics_per_request(speech, speech_app, caplog):
    before = metric(speech, "kztts_requests_total", endpoint="/v1/models", status="404")
    other = metric(speech, "kztts_requests_total", endpoint="other", status="404")
    with caplog.at_level(logging.INFO, logger="kztts.server.access"):
        call(speech_app, "GET", "/v1/models/someone-else")
        call(speech_app, "GET", "/v2/x")
    lines = [r.getMessage() for r in caplog.records if r.name == "kztts.server.access"]
    assert len(lines) == 2 and lines[0].startswith('127.0.0.1:50000 "GET /v1/models/someone-else" 404 ')
    assert metric(speech, "kztts_requests_total", endpoint="/v1/models", status="404") == before + 1
    assert metric(speech, "kztts_requests_total", endpoint="other", status="404") == other + 1
    assert metric(speech, "kztts_errors_total", status="404") >= 2
    answer = call(speech_app, "GET", "/metrics")
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"kztts_request_seconds_count" in answer.body and b"kztts_queue_depth 0.0" in answer.body


# ---------------------------------------------------------------- chat
def test_chat_whole_and_streamed_is_the_models_own(chat, chat_app, lm):
    from kztts.server.chat import prompt_of

    messages = [{"role": "user", "content": "Hello!"}]
    want = "".join(lm.generate(prompt_of(lm, messages), 10, greedy=True))
    answer = call(chat_app, "POST", "/v1/chat/completions", {"model": chat.model_id, "messages": messages,
                                                             "max_tokens": 10, "temperature": 0}).json()
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": want, "refusal": None}
    usage = answer["usage"]
    assert usage["prompt_tokens"] == len(lm.encode(prompt_of(lm, messages)))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    streamed = call(chat_app, "POST", "/v1/chat/completions", {
        "model": chat.model_id, "messages": messages, "max_tokens": 10, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    lines = [line[6:] for line in streamed.body.decode().splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2]) == want
    assert chunks[-2]["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage


def test_chat_lengths_against_the_context_and_the_limit(chat, chat_app):
    from kztts.server.chat import prompt_of

    model, lm, context = chat.model_id, chat.model, chat.engine.context
    short = [{"role": "user", "content": "hi"}]
    answer = call(chat_app, "POST", "/v1/chat/completions", {"model": model, "messages": short, "max_tokens": 49})
    assert answer.status == 400 and answer.error()["code"] == "above_limit"  # the server's limit: 48
    too_long = [{"role": "user", "content": "hi " * context}]
    answer = call(chat_app, "POST", "/v1/chat/completions", {"model": model, "messages": too_long})
    assert answer.status == 400 and answer.error()["code"] == "context_length_exceeded"
    assert answer.error()["message"].endswith(f"the context holds {context}: shorten it")

    def tokens(k: int) -> int:
        return len(lm.encode(prompt_of(lm, [{"role": "user", "content": "hi " * k}])))

    k = next(k for k in range(context, 0, -1) if tokens(k) <= context - 20)  # room for 21 tokens, not 48
    fits = [{"role": "user", "content": "hi " * k}]
    answer = call(chat_app, "POST", "/v1/chat/completions", {"model": model, "messages": fits, "max_tokens": 48})
    room = context + 1 - tokens(k)
    assert answer.status == 400 and answer.error()["code"] == "context_length_exceeded"
    assert f"lower max_tokens to {room} or shorten the conversation" in answer.error()["message"]
