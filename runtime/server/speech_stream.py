"""``/v1/audio/speech/stream``: speech from text as it is written, over a WebSocket.

The client sends, as JSON text messages:
  1. a setup: ``{"type": "setup", "model": ..., "voice": ..., "instructions": ..., "language": ...,
     "response_format": "pcm", "seed": ..., "greedy": ..., "max_frames": ..., sampling keys}`` (the keys of
     ``POST /v1/audio/speech`` but ``input``; audio is pcm16, 24 kHz mono), with ``"api_key"`` when the
     handshake carried no ``Authorization`` header (a browser's WebSocket cannot send one);
  2. text deltas of any size: ``{"type": "text", "text": "..."}``;
  3. the end: ``{"type": "end"}``.
The server answers ``{"type": "ready", "sample_rate": 24000, "format": "pcm16"}`` once the setup is accepted,
then sends the audio as binary messages (little-endian int16) as frames are decoded, ``{"type": "first_audio",
"ms": ...}`` (from the first text delta) before the first of them, and ``{"type": "done", ...}`` (frames, audio
seconds, pieces) at the end; an error ends the session with ``{"type": "error", "error": {...}}`` (OpenAI's
error body) and the socket's close. The text is spoken as it comes (``TTS.stream_text``'s streaming text mode:
one text token per frame), in a row of the batched engine that sits frames out while its text has not come;
a client that leaves frees its row.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import time

from starlette.websockets import WebSocket, WebSocketDisconnect

from kztts.core.errors import KzttsError
from kztts.generation.settings import with_overrides
from kztts.server.audio_out import pcm16
from kztts.server.bodies import written_speech_body
from kztts.server.errors import ApiError, bad
from kztts.server.scheduler import Job
from kztts.tts.model_kind import KindError
from kztts.tts.request import SynthesisRequest
from kztts.tts.text.track import TextFeed

log = logging.getLogger(__name__)
access_log = logging.getLogger("kztts.server.access")

PATH = "/v1/audio/speech/stream"
_KIND_PARAMS = {"speaker": "voice", "voice": "voice", "instruct": "instructions"}
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_ERROR = 1000, 1008, 1011


async def _message(ws: WebSocket) -> dict:
    """The next client message as a JSON object (a malformed one is a 400)."""
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if text is None:
        raise bad("a binary message: send JSON text messages (setup, text, end)", code="invalid_message")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"a message that is not JSON ({exc.msg} at character {exc.pos})", code="invalid_message") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise bad("a message must be a JSON object with a 'type' (setup, text or end)", code="invalid_message")
    return data


class SpeechSession:
    """One WebSocket connection: its setup, the text it writes into a ``TextFeed``, the audio it is sent."""

    def __init__(self, api, ws: WebSocket):
        self.api, self.ws, self.service = api, ws, api.service
        self.feed = TextFeed()
        self.job: Job | None = None
        self.chars = 0
        self.first_text: float | None = None
        self.status = 101

    async def run(self) -> None:
        ws = self.ws
        started = time.perf_counter()
        self.keyed = False  # the key came with the handshake (a browser's WebSocket cannot send one: its setup may)
        if ws.headers.get("authorization") or self.api._key is None:
            try:
                self.api._authorize(ws)
                self.keyed = True
            except ApiError as exc:
                await ws.close(code=CLOSE_POLICY, reason=exc.message[:120])
                self._log(started, 401)
                return
        await ws.accept()
        try:
            await self._session()
        except ApiError as exc:
            self.status = exc.status
            await self._fail(exc)
        except WebSocketDisconnect:
            self.status = 499
        except Exception:
            log.exception("bug in the speech stream; the session ends with a 500")
            self.status = 500
            await self._fail(ApiError(500, "internal error in kztts (the traceback is in the server log; please "
                                           "report it)", code="internal_error"))
        finally:
            if self.job is not None and not self.job.finished:
                self.job.cancel()  # a client that leaves (or errs) frees its row
            self.feed.fail(ConnectionError("the client's session ended"))
            self._log(started, self.status)

    async def _fail(self, error: ApiError) -> None:
        try:
            await self.ws.send_text(json.dumps({"type": "error", **error.body()}))
            await self.ws.close(code=CLOSE_POLICY if error.status < 500 else CLOSE_ERROR)
        except Exception:  # the client has gone already
            pass

    def _log(self, started: float, status: int) -> None:
        m = self.service.metrics
        m.requests.labels(PATH, str(status)).inc()
        if status >= 400:
            m.errors.labels(str(status)).inc()
        m.latency.labels(PATH).observe(time.perf_counter() - started)
        client = self.ws.client or ("-", 0)
        access_log.info('%s:%s "WEBSOCKET %s" %d %d chars %.3f s', client[0], client[1], PATH, status, self.chars,
                        time.perf_counter() - started)

    async def _session(self) -> None:
        s = self.service
        setup = await _message(self.ws)
        if setup["type"] != "setup":
            raise bad(f"the first message must be the setup ({{\"type\": \"setup\", \"model\": ...}}), not "
                      f"{setup['type']!r}", code="invalid_message")
        key = setup.pop("api_key", None)
        if not self.keyed:
            self.api.check_key(key)
        body = written_speech_body({k: v for k, v in setup.items() if k != "type"}, s.limits)
        self.api._model(body.model, speech=True)
        if s.scheduler.draining:
            raise ApiError(503, "the server is shutting down; retry on another instance or later", code="draining")
        voice = s.voices.get(body.voice)
        loop = asyncio.get_running_loop()
        try:
            settings = with_overrides(s.settings, body.overrides, body.override_names)
            request = SynthesisRequest("", voice, language=body.language, seed=body.seed, greedy=body.greedy,
                                       settings=settings, max_frames=body.max_frames, streaming_text=True,
                                       instruct=body.instructions)
            s.model.kind.check(request)
            spec = await loop.run_in_executor(None, functools.partial(s.engine.prepare, request, True,
                                                                      text=self.feed))
        except KindError as exc:
            raise bad(str(exc), param=_KIND_PARAMS[exc.key], code="unsupported_parameter"
                      if exc.key == "instruct" else "invalid_value") from None
        except KzttsError as exc:
            raise bad(str(exc)) from None
        self.job = Job("speech", spec, loop)
        s.scheduler.submit(self.job)  # 429 / 503 as ApiError
        await self.ws.send_text(json.dumps({"type": "ready", "sample_rate": s.model.sample_rate,
                                            "format": "pcm16"}))
        reader = asyncio.ensure_future(self._read_text())
        try:
            await self._send_audio(reader)
        finally:
            if not reader.done():
                reader.cancel()

    async def _read_text(self) -> None:
        """The client's text deltas into the feed, until its end message."""
        limit = self.service.limits.max_input_chars
        while True:
            message = await _message(self.ws)
            kind = message["type"]
            if kind == "text":
                if self.feed.closed:
                    raise bad("text after the end message: a session speaks one text; open another for the next",
                              code="text_after_end")
                text = message.get("text")
                if not isinstance(text, str):
                    raise bad("a text message needs 'text', a string", param="text")
                self.chars += len(text)
                if self.chars > limit:
                    raise ApiError(413, f"the text passes this server's limit of {limit} characters per session",
                                   param="text", code="input_too_long")
                if text and self.first_text is None:
                    self.first_text = time.perf_counter()
                self.feed.write(text)
            elif kind == "end":
                if self.feed.closed:
                    raise bad("a second end message", code="text_after_end")
                self.feed.close()
            else:
                raise bad(f"unknown message type {kind!r}: send 'text' or 'end'", code="invalid_message")

    async def _send_audio(self, reader: asyncio.Future) -> None:
        """The job's audio and events to the client; a reader's error (a bad message, a client that left) ends
        the session."""
        s, job, sent = self.service, self.job, 0
        while True:
            get = asyncio.ensure_future(job.events.get())
            await asyncio.wait({get, reader}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():  # the reader ends only by an error: a bad message, or the client left
                get.cancel()
                reader.result()
            kind, value = get.result()
            if kind == "audio":
                if sent == 0:
                    ms = (time.perf_counter() - (self.first_text or job.received)) * 1000
                    s.metrics.first_audio.observe(time.perf_counter() - job.received)
                    await self.ws.send_text(json.dumps({"type": "first_audio", "ms": round(ms, 1)}))
                sent += value.shape[0]
                await self.ws.send_bytes(pcm16(value))
            elif kind == "done":
                s.metrics.audio_seconds.inc(sent / s.model.sample_rate)
                await self.ws.send_text(json.dumps({"type": "done", **value}))
                await self.ws.close(code=CLOSE_NORMAL)
                self.status = 200
                return
            else:
                raise value


async def speech_stream(api, ws: WebSocket) -> None:
    """The WebSocket route's handler."""
    await SpeechSession(api, ws).run()
