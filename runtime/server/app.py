"""The HTTP API (Starlette): OpenAI's ``/v1/audio/speech``, ``/v1/chat/completions``, ``/v1/models``,
kztts's ``/v1/audio/voices``, ``/health`` and ``/metrics``.

Every handler checks the key, reads and checks the body, and hands a ``Job`` to the scheduler; then it
waits for the job's first event before answering, so a refusal found late (a request the engine cannot
start) is still a status with OpenAI's error body. Streamed answers (audio chunks, server-sent events)
follow as the scheduler emits them; a client that leaves cancels its job (its row is free at the next
frame). Any exception that is not a refusal is a bug: a 500 with OpenAI's error body, its traceback
logged, and the server goes on. One access-log line per request (``kztts.server.access``).
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute

from kztts.assistant.spoken_reply import SpeakSettings
from kztts.core.errors import KzttsError
from kztts.generation.settings import with_overrides
from kztts.server.audio_out import encode, media_type, pcm16, wav_stream_header
from kztts.server.bodies import SPEECH_MODEL_ALIASES, chat_body, parse_json, speech_body
from kztts.server.chat import ChatSpec, params_of, prompt_of
from kztts.server.errors import ApiError, bad, error_body
from kztts.server.scheduler import Job
from kztts.server.service import Service
from kztts.server.speech_stream import PATH as SPEECH_STREAM_PATH
from kztts.server.speech_stream import speech_stream
from kztts.server.voices import offer
from kztts.tts.model_kind import KindError
from kztts.tts.request import SynthesisRequest

log = logging.getLogger(__name__)
access_log = logging.getLogger("kztts.server.access")

_KIND_PARAMS = {"speaker": "voice", "voice": "voice", "instruct": "instructions"}  # a request field -> its body key
PAGE = Path(__file__).with_name("page") / "index.html"
AUDIO_KEPT_SECONDS = 3600  # a spoken reply's expires_at: kztts keeps no audio, the id only names it
ENDPOINTS = ("/v1/audio/speech", "/v1/audio/speech/stream", "/v1/audio/voices", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


class _ClientLeft(Exception):
    """The client closed the connection before its answer began."""


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _json(data: dict, status: int = 200) -> Response:
    return Response(json.dumps(data, ensure_ascii=False), status_code=status, media_type="application/json")


async def _left(request: Request) -> None:
    """Return when the client disconnects (the body has been read: the next message is the end)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def next_event(job: Job, request: Request) -> tuple[str, object]:
    """The job's next event; the job is cancelled (and ``_ClientLeft`` raised) if the client leaves first."""
    get = asyncio.ensure_future(job.events.get())
    gone = asyncio.ensure_future(_left(request))
    try:
        await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (get, gone):
            if not task.done():
                task.cancel()
    if gone.done() and not gone.cancelled():
        job.cancel()
        raise _ClientLeft()
    return get.result()


def _raise(kind: str, value) -> None:
    if kind == "error":
        raise value


class Api:
    """The routes of one ``Service``."""

    def __init__(self, service: Service):
        self.service = service
        key = service.options.api_key
        self._key = key.encode() if key else None

    # ------------------------------------------------------------ plumbing
    def _authorize(self, request: Request) -> None:
        if self._key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")
        if not hmac.compare_digest(given.strip().encode(), self._key):
            raise ApiError(401, "incorrect API key", code="invalid_api_key")

    def check_key(self, given) -> None:
        """A key given other than in the Authorization header (a WebSocket setup's ``api_key``)."""
        if self._key is None:
            return
        if not isinstance(given, str) or not given:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer KEY' with the handshake, or "
                                "'api_key' in the setup", code="invalid_api_key")
        if not hmac.compare_digest(given.strip().encode(), self._key):
            raise ApiError(401, "incorrect API key", code="invalid_api_key")

    async def _body(self, request: Request) -> dict:
        limit = self.service.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the request body has {declared} bytes; the limit is {limit}", code="body_too_large")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise ApiError(413, f"the request body passes the limit of {limit} bytes", code="body_too_large")
        return parse_json(bytes(raw))

    @staticmethod
    def _submit(request: Request, job: Job, scheduler) -> None:
        scheduler.submit(job)
        request.state.job = job  # whatever ends the handler early cancels it (route)

    def route(self, handler: Callable[[Request], Awaitable[Response]], *, auth: bool = True,
              work: bool = False) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` inside the key check and the error boundary; ``work``: refused while draining."""
        async def endpoint(request: Request) -> Response:
            try:
                if auth:
                    self._authorize(request)
                if work and self.service.scheduler.draining:
                    raise ApiError(503, "the server is shutting down; retry on another instance or later",
                                   code="draining", headers={"Retry-After": "5", "Connection": "close"})
                return await handler(request)
            except ApiError as exc:
                response = error_response(exc)
            except _ClientLeft:
                request.state.left = True
                response = Response(status_code=499)
            except Exception:
                log.exception("bug while answering %s %s", request.method, request.url.path)
                response = error_response(ApiError(500, "internal error in kztts (the traceback is in the server log; "
                                                        "please report it)", code="internal_error"))
            job = getattr(request.state, "job", None)
            if job is not None:  # a job nobody will read any more frees its row
                job.cancel()
            return response
        return endpoint

    def _model(self, name: str, speech: bool) -> None:
        s = self.service
        wanted = ("speech" if s.kind == "tts" else "chat")
        if speech != (s.kind == "tts"):
            raise ApiError(404, f"this server serves a {wanted} model ({s.model_id!r}); "
                                f"{'speech' if speech else 'chat'} is not available here", param="model",
                           code="model_not_found")
        if name != s.model_id and not (speech and name in SPEECH_MODEL_ALIASES):
            also = f" (or {', '.join(SPEECH_MODEL_ALIASES)})" if speech else ""
            raise ApiError(404, f"model {name[:80]!r} is not served here; use {s.model_id!r}{also}", param="model",
                           code="model_not_found")

    # ------------------------------------------------------------ speech
    async def speech(self, request: Request) -> Response:
        s = self.service
        body = speech_body(await self._body(request), s.limits)
        self._model(body.model, speech=True)
        voice = s.voices.get(body.voice)
        try:
            settings = with_overrides(s.settings, body.overrides, body.override_names)
            synthesis = SynthesisRequest(body.input, voice, language=body.language, seed=body.seed,
                                         greedy=body.greedy, settings=settings, max_frames=body.max_frames,
                                         streaming_text=body.streaming_text, instruct=body.instructions)
            s.model.kind.check(synthesis)
            loop = asyncio.get_running_loop()
            spec = await loop.run_in_executor(None, s.engine.prepare, synthesis, body.stream)
        except KindError as exc:  # named by its OpenAI key
            raise bad(str(exc), param=_KIND_PARAMS[exc.key], code="unsupported_parameter"
                      if exc.key == "instruct" else "invalid_value") from None
        except KzttsError as exc:
            raise bad(str(exc)) from None
        job = Job("speech", spec, asyncio.get_running_loop())
        self._submit(request, job, s.scheduler)
        sr = s.model.sample_rate
        first = await next_event(job, request)
        _raise(*first)
        if not body.stream:
            chunks, event = [], first
            while event[0] == "audio":
                chunks.append(event[1])
                event = await next_event(job, request)
            _raise(*event)
            samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            self._spoken(job, samples, sr)
            data = await asyncio.get_running_loop().run_in_executor(None, encode, samples, sr, body.response_format)
            return Response(data, media_type=media_type(body.response_format),
                            headers={"X-Kztts-Frames": str(event[1]["frames"])})
        tokens = len(s.model.tokenizer.encode(body.input))  # the usage's input tokens: the text's own
        return StreamingResponse(self._audio_stream(job, first, sr, body.response_format, body.sse, request, tokens),
                                 media_type="text/event-stream" if body.sse else media_type(body.response_format),
                                 headers={"Cache-Control": "no-cache"})

    def _spoken(self, job: Job, samples: np.ndarray, sr: int) -> None:
        m = self.service.metrics
        m.first_audio.observe(time.perf_counter() - job.received)
        m.audio_seconds.inc(samples.shape[0] / sr)

    async def _audio_stream(self, job: Job, first, sr: int, fmt: str, sse: bool,
                            request: Request, input_tokens: int = 0) -> AsyncIterator[bytes]:
        m = self.service.metrics
        sent = 0
        event = first
        complete = False
        try:
            if fmt == "wav" and not sse:
                yield wav_stream_header(sr)
            while True:
                kind, value = event
                if kind == "audio":
                    if sent == 0:
                        m.first_audio.observe(time.perf_counter() - job.received)
                    sent += value.shape[0]
                    data = pcm16(value)
                    if sse:
                        delta = (wav_stream_header(sr) + data) if fmt == "wav" and sent == value.shape[0] else data
                        yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(delta).decode()})
                    else:
                        yield data
                elif kind == "done":
                    complete = True
                    m.audio_seconds.inc(sent / sr)
                    if sse:
                        yield _sse({"type": "speech.audio.done", "usage": {
                            "input_tokens": input_tokens, "output_tokens": value["frames"],
                            "total_tokens": input_tokens + value["frames"]}})
                    return
                else:  # an error after the first chunk: a bug, logged where it happened
                    if sse:
                        yield _sse({"type": "error", **value.body()})
                        return
                    raise RuntimeError(f"request {job.id} failed after its audio began: {value.message}")
                event = await job.events.get()
        finally:
            if not complete:
                job.cancel()
                request.state.left = not job.finished

    # ------------------------------------------------------------ chat
    async def chat(self, request: Request) -> Response:
        s = self.service
        body = chat_body(await self._body(request))
        self._model(body.model, speech=False)
        lm = s.model
        prompt = prompt_of(lm, body.messages)
        loop = asyncio.get_running_loop()
        ids = await loop.run_in_executor(None, lm.encode, prompt)
        context = s.engine.context
        room = context + 1 - len(ids)  # the last token is never fed: n + max_tokens - 1 positions
        if room < 1:
            raise ApiError(400, f"the conversation takes {len(ids)} tokens; the context holds {context}: shorten it",
                           param="messages", code="context_length_exceeded")
        max_tokens = body.max_tokens
        if max_tokens is None:
            max_tokens = min(s.limits.max_tokens, room)
        elif max_tokens > s.limits.max_tokens:
            raise bad(f"'max_tokens' {max_tokens} is above this server's limit of {s.limits.max_tokens}",
                      param="max_tokens", code="above_limit")
        elif max_tokens > room:
            raise ApiError(400, f"the conversation takes {len(ids)} tokens and asks for {max_tokens} more; the "
                                f"context holds {context}: lower max_tokens to {room} or shorten the conversation",
                           param="max_tokens", code="context_length_exceeded")
        try:
            params = params_of(lm, body.temperature, body.top_p, body.top_k, body.repetition_penalty, body.greedy)
        except KzttsError as exc:
            raise bad(str(exc)) from None
        speak = None
        if body.audio is not None:
            if s.tts is None:
                raise bad("this server speaks no replies: start it with --tts TTS_BUNDLE to answer modalities "
                          "[\"text\", \"audio\"]", param="modalities", code="unsupported_parameter")
            speak = SpeakSettings(s.voices.get(body.audio["voice"]), seed=body.seed, greedy=body.greedy,
                                  settings=s.settings)
        job = Job("chat", ChatSpec(prompt, ids, max_tokens, params, body.seed, speak), loop)
        self._submit(request, job, s.scheduler)
        ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        first = await next_event(job, request)
        _raise(*first)
        if body.audio is not None:
            return await self._spoken_chat(job, first, ident, created, body, request)
        if body.stream:
            return StreamingResponse(self._chat_stream(job, first, ident, created, body.include_usage, request),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        parts = []
        event = first
        while event[0] == "text":
            if not parts:
                s.metrics.first_token.observe(time.perf_counter() - job.received)
            parts.append(event[1])
            event = await next_event(job, request)
        _raise(*event)
        done = event[1]
        return _json({"id": ident, "object": "chat.completion", "created": created, "model": s.model_id,
                      "system_fingerprint": None,
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": done["text"],
                                                           "refusal": None},
                                   "logprobs": None, "finish_reason": done["finish_reason"]}],
                      "usage": _usage(done)})

    async def _spoken_chat(self, job: Job, first, ident: str, created: int, body, request: Request) -> Response:
        """A spoken reply in OpenAI's form: ``message.audio`` (base64 data, transcript, id, expires_at) whole,
        or chunks whose ``delta.audio`` carries transcript pieces and base64 pcm16 data as they are made."""
        s = self.service
        sr = s.tts.sample_rate
        audio_id = f"audio_{uuid.uuid4().hex[:24]}"
        expires_at = created + AUDIO_KEPT_SECONDS
        if body.stream:
            return StreamingResponse(self._spoken_stream(job, first, ident, created, audio_id, expires_at,
                                                         body.include_usage, request),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        chunks, event = [], first
        while event[0] in ("text", "audio"):
            if event[0] == "audio":
                if not chunks:
                    s.metrics.chat_first_audio.observe(time.perf_counter() - job.received)
                chunks.append(event[1])
            event = await next_event(job, request)
        _raise(*event)
        done = event[1]
        samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        s.metrics.audio_seconds.inc(samples.shape[0] / sr)
        fmt = "pcm" if body.audio["format"] == "pcm16" else body.audio["format"]
        data = await asyncio.get_running_loop().run_in_executor(None, encode, samples, sr, fmt)
        audio = {"id": audio_id, "data": base64.b64encode(data).decode(), "expires_at": expires_at,
                 "transcript": done["text"]}
        return _json({"id": ident, "object": "chat.completion", "created": created, "model": s.model_id,
                      "system_fingerprint": None,
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None,
                                                           "audio": audio},
                                   "logprobs": None, "finish_reason": done["finish_reason"]}],
                      "usage": _usage(done)})

    def _spoken_stream(self, job: Job, first, ident: str, created: int, audio_id: str, expires_at: int,
                       include_usage: bool, request: Request) -> AsyncIterator[bytes]:
        s = self.service
        sent = 0

        def delta(kind: str, value) -> dict:
            nonlocal sent
            if kind == "text":
                return {"audio": {"id": audio_id, "transcript": value}}
            if sent == 0:
                s.metrics.chat_first_audio.observe(time.perf_counter() - job.received)
            sent += value.shape[0]
            return {"audio": {"id": audio_id, "data": base64.b64encode(pcm16(value)).decode()}}

        def closing() -> dict:
            s.metrics.audio_seconds.inc(sent / s.tts.sample_rate)
            return {"audio": {"id": audio_id, "expires_at": expires_at}}

        return self._reply_chunks(job, first, ident, created, include_usage, request,
                                  {"role": "assistant", "content": None, "audio": {"id": audio_id, "transcript": ""}},
                                  delta, closing)

    def _chat_stream(self, job: Job, first, ident: str, created: int, include_usage: bool,
                     request: Request) -> AsyncIterator[bytes]:
        first_token = True

        def delta(kind: str, value) -> dict:
            nonlocal first_token
            if first_token:
                self.service.metrics.first_token.observe(time.perf_counter() - job.received)
                first_token = False
            return {"content": value}

        return self._reply_chunks(job, first, ident, created, include_usage, request,
                                  {"role": "assistant", "content": ""}, delta, dict)

    async def _reply_chunks(self, job: Job, first, ident: str, created: int, include_usage: bool, request: Request,
                            opening: dict, delta: Callable[[str, object], dict],
                            closing: Callable[[], dict]) -> AsyncIterator[bytes]:
        """A streamed chat reply's ``chat.completion.chunk`` events: ``opening``, one ``delta(kind, value)`` per
        text or audio event, ``closing()`` with the finish reason, the usage chunk if asked, ``[DONE]``; an error
        event ends it with its error body, and a client that leaves cancels the job."""
        model = self.service.model_id

        def chunk(delta: dict, finish: str | None = None) -> bytes:
            return _chunk_sse(ident, created, model, [{"index": 0, "delta": delta, "logprobs": None,
                                                       "finish_reason": finish}])

        complete = False
        event = first
        try:
            yield chunk(opening)
            while True:
                kind, value = event
                if kind in ("text", "audio"):
                    yield chunk(delta(kind, value))
                elif kind == "done":
                    complete = True
                    yield chunk(closing(), value["finish_reason"])
                    if include_usage:
                        yield _chunk_sse(ident, created, model, [], usage=_usage(value))
                    yield b"data: [DONE]\n\n"
                    return
                else:
                    complete = True
                    yield _sse(value.body())
                    return
                event = await job.events.get()
        finally:
            if not complete:
                job.cancel()
                request.state.left = True

    # ------------------------------------------------------------ listings and operations
    async def page(self, request: Request) -> Response:
        """The try-it page (``kztts/server/page/index.html``: plain HTML and JS, nothing fetched elsewhere)."""
        return Response(PAGE.read_bytes(), media_type="text/html; charset=utf-8")

    async def voices(self, request: Request) -> Response:
        s = self.service
        if s.voices is None:
            raise ApiError(404, f"this server serves a chat model ({s.model_id!r}): it has no voices",
                           code="not_found")
        return _json({"object": "list", "data": s.voices.listing()})

    def _model_card(self) -> dict:
        s = self.service
        card = {"id": s.model_id, "object": "model", "created": int(s.options.bundle.stat().st_mtime),
                "owned_by": "kztts", "kind": "speech" if s.kind == "tts" else "chat"}
        if s.tts is not None:
            card["tts"] = offer(s.tts.kind)
        return card

    async def models(self, request: Request) -> Response:
        return _json({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model_id"]
        if name != self.service.model_id:
            raise ApiError(404, f"model {name[:80]!r} is not served here; use {self.service.model_id!r}",
                           param="model", code="model_not_found")
        return _json(self._model_card())

    async def health(self, request: Request) -> Response:
        s = self.service
        running, waiting = s.scheduler.counts()
        state = "ready" if s.ready else "draining" if s.scheduler.draining else "down"
        return _json({"status": state, "model": s.model_id, "kind": s.kind, "running": running, "waiting": waiting,
                      "batch": s.engine.capacity, "mode": s.engine.mode}, 200 if state == "ready" else 503)

    async def metrics(self, request: Request) -> Response:
        s = self.service
        s.metrics.queue_depth.set(s.scheduler.counts()[1])
        return Response(s.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _sse(data: dict) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _chunk_sse(ident: str, created: int, model: str, choices: list, **extra) -> bytes:
    """One ``chat.completion.chunk`` event of a streamed chat completion (text or spoken)."""
    return _sse({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                 "system_fingerprint": None, "choices": choices, **extra})


def _usage(done: dict) -> dict:
    p, c = done["prompt_tokens"], done["completion_tokens"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


class AccessLog:
    """ASGI middleware: one log line and the request metrics per HTTP request."""

    def __init__(self, app, service: Service):
        self.app = app
        self.metrics = service.metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status, size = [0], [0]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                size[0] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            path = scope.get("path", "")
            endpoint = path if path in ENDPOINTS else "/v1/models" if path.startswith("/v1/models/") else "other"
            left = bool(scope.get("state", {}).get("left"))
            code = status[0] or 499
            self.metrics.requests.labels(endpoint, str(code)).inc()
            if code >= 400:
                self.metrics.errors.labels(str(code)).inc()
            self.metrics.latency.labels(endpoint).observe(seconds)
            client = scope.get("client") or ("-", 0)
            access_log.info('%s:%s "%s %s" %d %d B %.3f s%s', client[0], client[1], scope.get("method", ""), path,
                            code, size[0], seconds, " (client left)" if left else "")


def build_app(service: Service) -> Starlette:
    """The ASGI app of ``service`` (its scheduler started by the caller)."""
    api = Api(service)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = {404: f"no route {request.url.path}; the endpoints are {', '.join(ENDPOINTS)}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return JSONResponse(error_body(exc.status_code, message, code="not_found" if exc.status_code == 404 else None),
                            status_code=exc.status_code)

    routes = [
        Route("/v1/audio/speech", api.route(api.speech, work=True), methods=["POST"]),
        WebSocketRoute(SPEECH_STREAM_PATH, lambda ws: speech_stream(api, ws)),
        Route("/", api.route(api.page, auth=False), methods=["GET"]),
        Route("/v1/audio/voices", api.route(api.voices), methods=["GET"]),
        Route("/v1/chat/completions", api.route(api.chat, work=True), methods=["POST"]),
        Route("/v1/models", api.route(api.models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.route(api.model), methods=["GET"]),
        Route("/health", api.route(api.health, auth=False), methods=["GET"]),
        Route("/metrics", api.route(api.metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    return AccessLog(app, service)
