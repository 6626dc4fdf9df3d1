"""Request bodies checked into what the engines run: ``SpeechBody`` (``POST /v1/audio/speech``) and
``ChatBody`` (``POST /v1/chat/completions``). Every refusal is an ``ApiError`` naming the key.

A body is OpenAI's, plus kztts's own keys in the same object: for speech the keys of a
``kztts synth --file`` line (``language``, ``seed``, ``greedy``, ``max_frames``, ``streaming_text`` and
the sampling keys ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``cp_*``) and ``stream``;
for chat ``greedy``, ``top_k`` and ``repetition_penalty``. An unknown key is refused (as OpenAI does),
an OpenAI key kztts does not implement is accepted only at its default value.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from kztts.generation.settings import SAMPLING_FLAGS
from kztts.server.errors import ApiError, bad

# response_format -> (soundfile format, subtype, media type); pcm is raw 16-bit little-endian, 24 kHz mono
AUDIO_FORMATS = {
    "wav": ("WAV", "PCM_16", "audio/wav"),
    "pcm": ("RAW", "PCM_16", "audio/pcm"),
    "flac": ("FLAC", "PCM_16", "audio/flac"),
    "mp3": ("MP3", "MPEG_LAYER_III", "audio/mpeg"),
    "opus": ("OGG", "OPUS", "audio/ogg"),
}
STREAMED_FORMATS = ("pcm", "wav")  # sent as they are decoded; the others are whole files
STREAM_FORMATS = ("audio", "sse")
# OpenAI's speech model names, accepted for the served TTS bundle (apps send one of them)
SPEECH_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
VOICE_DEFAULT = "default"


@dataclass(frozen=True)
class Limits:
    """Per-request limits: text characters (413), frames per utterance and reply tokens (400), body bytes (413)."""

    max_input_chars: int = 4096
    max_frames: int = 2047
    max_tokens: int = 1024
    max_body_bytes: int = 1 << 20


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        msg = (f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError)
               else str(exc))
        raise bad(f"the request body is not valid JSON ({msg})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


def _type_name(value: Any) -> str:
    return "null" if value is None else {bool: "a boolean", str: "a string", int: "an integer", float: "a number",
                                          list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def _wrong(key: str, want: str, value: Any) -> ApiError:
    return bad(f"'{key}' must be {want}, got {_type_name(value)} ({json.dumps(value)[:60]})", param=key,
               code="invalid_type")


def _str(body: dict, key: str, default=None, required: bool = False):
    if key not in body or body[key] is None:
        if required:
            raise bad(f"'{key}' is required", param=key, code="missing_required_parameter")
        return default
    if not isinstance(body[key], str):
        raise _wrong(key, "a string", body[key])
    return body[key]


def _int(body: dict, key: str, default=None, lo: int | None = None):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(key, "an integer", value)
    if lo is not None and value < lo:
        raise bad(f"'{key}' must be >= {lo}, got {value}", param=key)
    return value


def _bool(body: dict, key: str, default=None):
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _wrong(key, "true or false", value)
    return value


def _num(body: dict, key: str, default=None):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _wrong(key, "a finite number", value)
    return float(value)


def _unknown(body: dict, known: set[str], ignored: dict[str, Callable[[Any], bool]]) -> None:
    """Refuse unknown keys, and OpenAI keys kztts ignores when they are not at their default."""
    for key, value in body.items():
        if key in known:
            continue
        at_default = ignored.get(key)
        if at_default is None:
            raise bad(f"unrecognized request argument '{key}'", param=key, code="unknown_parameter")
        if value is not None and not at_default(value):
            raise bad(f"'{key}' = {json.dumps(value)[:60]} is not supported by kztts (leave it out)", param=key,
                      code="unsupported_parameter")


def _empty(value: Any) -> bool:
    return not value


@dataclass(frozen=True)
class SpeechBody:
    """A checked ``POST /v1/audio/speech`` body."""

    model: str
    input: str
    voice: str  # a name of the server's voice book ("default": the bundle's default)
    response_format: str
    stream: bool  # audio sent as it is decoded (``TTS.stream``), else the whole file (``TTS.synthesize``)
    sse: bool  # stream as server-sent events (``stream_format`` "sse")
    language: str | None
    seed: int
    greedy: bool
    max_frames: int | None
    streaming_text: bool
    instructions: str | None = None  # the instruction (VoiceDesign, 1.7B CustomVoice); the bundle's kind checks it
    overrides: dict = field(default_factory=dict)  # sampling overrides keyed like $KZTTS_TEMP...
    override_names: dict = field(default_factory=dict)  # the same keys -> the body key, for messages


_SPEECH_KEYS = {"model", "input", "voice", "response_format", "speed", "stream_format", "instructions", "stream",
                "language", "seed", "greedy", "max_frames", "streaming_text", *SAMPLING_FLAGS}


def written_speech_body(setup: dict, limits: Limits) -> SpeechBody:
    """Check the setup of a speech stream whose text comes as it is written (``/v1/audio/speech/stream``): the
    keys of a speech body but ``input`` (the text comes later), ``stream`` and ``stream_format``; pcm16 audio."""
    for key, why in (("input", "send the text in 'text' messages after the setup"),
                     ("stream", "the audio is always streamed"), ("stream_format", "the audio is always streamed"),
                     ("streaming_text", "the text is always read as it comes")):
        if key in setup:
            raise bad(f"'{key}' is not a setup key here: {why}", param=key, code="unknown_parameter")
    fmt = setup.get("response_format", "pcm")
    if fmt != "pcm":
        raise bad(f"'response_format' {fmt!r}: a speech stream sends pcm16 (give 'pcm' or leave it out)",
                  param="response_format")
    body = speech_body({**setup, "input": "(written)", "response_format": "pcm", "stream": True}, limits)
    return replace(body, input="", streaming_text=True)


def speech_body(body: dict, limits: Limits) -> SpeechBody:
    """Check a speech body (types, ranges, limits); the voice and model names are checked by the caller."""
    _unknown(body, _SPEECH_KEYS, {})
    model = _str(body, "model", required=True)
    text = _str(body, "input", required=True)
    if not text.strip():
        raise bad("'input' is empty; give the text to speak", param="input", code="empty_input")
    if len(text) > limits.max_input_chars:
        raise ApiError(413, f"'input' has {len(text)} characters; this server speaks at most {limits.max_input_chars} "
                            "per request (split the text, or start the server with a larger --max-input)",
                       param="input", code="input_too_long")
    voice = body.get("voice")
    if isinstance(voice, dict) and set(voice) == {"id"}:  # OpenAI's custom-voice form {"id": ...}
        voice = voice["id"]
    if voice is not None and not isinstance(voice, str):
        raise _wrong("voice", "a voice name (see GET /v1/audio/voices)", voice)
    # OpenAI's default is mp3, a whole file; a body that asks for a stream (stream_format, or stream true) and names no
    # format gets pcm, the format every stream can send
    asks_stream = body.get("stream_format") is not None or body.get("stream") is True
    fmt = _str(body, "response_format", "pcm" if asks_stream else "mp3")
    if fmt not in AUDIO_FORMATS:
        raise bad(f"'response_format' {fmt!r} is not available; use one of {', '.join(AUDIO_FORMATS)}"
                  + (" (no AAC encoder in libsndfile)" if fmt == "aac" else ""), param="response_format")
    speed = _num(body, "speed", 1.0)
    if speed != 1.0:
        raise bad(f"'speed' {speed:g} is not supported: kztts speaks at the model's own pace (give 1.0 or leave it "
                  "out; resample the audio on the client to change it)", param="speed", code="unsupported_parameter")
    instructions = _str(body, "instructions")
    stream_format = _str(body, "stream_format")
    if stream_format is not None and stream_format not in STREAM_FORMATS:
        raise bad(f"'stream_format' {stream_format!r}: expected one of {', '.join(STREAM_FORMATS)}",
                  param="stream_format")
    stream = _bool(body, "stream")
    if stream is False and stream_format is not None:
        raise bad("'stream' false contradicts 'stream_format'; give one of them", param="stream")
    if stream is None:
        stream = stream_format is not None or fmt == "pcm"
    if stream and fmt not in STREAMED_FORMATS:
        raise bad(f"'response_format' {fmt} is sent whole, not streamed; stream {' or '.join(STREAMED_FORMATS)}",
                  param="stream_format" if stream_format else "stream")
    max_frames = _int(body, "max_frames", lo=1)
    if max_frames is not None and max_frames > limits.max_frames:
        raise bad(f"'max_frames' {max_frames} is above this server's limit of {limits.max_frames} frames per "
                  "utterance", param="max_frames", code="above_limit")
    overrides, names = {}, {}
    for key, env in SAMPLING_FLAGS.items():
        if body.get(key) is not None:
            value = body[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _wrong(key, "a number", value)
            overrides[env], names[env] = value, f"'{key}'"
    return SpeechBody(model=model, input=text, voice=voice or VOICE_DEFAULT, response_format=fmt, stream=stream,
                      sse=stream_format == "sse", language=_str(body, "language"), seed=_int(body, "seed", 0),
                      greedy=_bool(body, "greedy", False), max_frames=max_frames,
                      streaming_text=_bool(body, "streaming_text", False), instructions=instructions or None,
                      overrides=overrides, override_names=names)


@dataclass(frozen=True)
class ChatBody:
    """A checked ``POST /v1/chat/completions`` body (messages as ``kztts.lm.chatml`` renders them)."""

    model: str
    messages: list  # [{"role": system|user|assistant, "content": str}]
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    repetition_penalty: float | None
    seed: int
    greedy: bool
    stream: bool
    include_usage: bool
    audio: dict | None = None  # {"voice": name, "format": f} when "audio" is among the modalities


_CHAT_KEYS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stream",
              "stream_options", "greedy", "top_k", "repetition_penalty", "modalities", "audio"}
CHAT_AUDIO_FORMATS = ("wav", "pcm16", "flac")  # OpenAI's names; streamed replies take pcm16 only, as OpenAI's


def _chat_audio(body: dict, stream: bool) -> dict | None:
    """The reply's audio (``modalities: ["text", "audio"]`` with ``audio: {voice, format}``), or None."""
    modalities = body.get("modalities", ["text"])
    if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
        raise _wrong("modalities", 'an array such as ["text"] or ["text", "audio"]', modalities)
    if set(modalities) - {"text", "audio"} or "text" not in modalities:
        raise bad(f"'modalities' {json.dumps(modalities)}: expected [\"text\"] or [\"text\", \"audio\"]",
                  param="modalities")
    audio = body.get("audio")
    if "audio" not in modalities:
        if audio is not None:
            raise bad("'audio' is given but 'modalities' does not ask for audio; add \"audio\" to it",
                      param="modalities")
        return None
    if not isinstance(audio, dict):
        raise bad("'modalities' asks for audio: give 'audio': {\"voice\": NAME, \"format\": \"wav\"}",
                  param="audio", code="missing_required_parameter")
    extra = set(audio) - {"voice", "format"}
    if extra:
        raise bad(f"'audio.{sorted(extra)[0]}' is not supported; give voice and format", param="audio")
    voice = audio.get("voice", VOICE_DEFAULT)  # none named: the bundle's default, as on every route
    if isinstance(voice, dict):
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice:
        raise _wrong("audio.voice", "a voice name (GET /v1/audio/voices)", audio.get("voice"))
    fmt = audio.get("format")
    if fmt not in CHAT_AUDIO_FORMATS:
        raise bad(f"'audio.format' {json.dumps(fmt)} is not available; use one of {', '.join(CHAT_AUDIO_FORMATS)}",
                  param="audio.format")
    if stream and fmt != "pcm16":
        raise bad(f"'audio.format' {fmt!r} cannot be streamed; a streamed spoken reply is pcm16 (24 kHz, 16-bit, "
                  "mono)", param="audio.format")
    return {"voice": voice, "format": fmt}
# OpenAI keys accepted at their default value only (kztts does not implement the others)
_CHAT_IGNORED: dict[str, Callable[[Any], bool]] = {
    "n": lambda v: v == 1, "presence_penalty": lambda v: v == 0, "frequency_penalty": lambda v: v == 0,
    "logprobs": lambda v: v is False, "top_logprobs": lambda v: v == 0, "stop": _empty, "logit_bias": _empty,
    "tools": _empty, "tool_choice": lambda v: v == "none", "functions": _empty, "function_call": lambda v: v == "none",
    "parallel_tool_calls": lambda v: True, "response_format": lambda v: v == {"type": "text"},
    "user": lambda v: True, "metadata": lambda v: True, "store": lambda v: True, "service_tier": lambda v: True,
    "prompt_cache_key": lambda v: True, "safety_identifier": lambda v: True,
    "reasoning_effort": _empty, "verbosity": _empty, "prediction": _empty,
    "web_search_options": _empty,
}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _content(i: int, message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                          "supported", param=f"messages[{i}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise _wrong(f"messages[{i}].content", "a string or an array of text parts", content)


def chat_body(body: dict) -> ChatBody:
    """Check a chat body; the model name and the prompt's length are checked by the caller."""
    _unknown(body, _CHAT_KEYS, _CHAT_IGNORED)
    model = _str(body, "model", required=True)
    messages = body.get("messages")
    if messages is None:
        raise bad("'messages' is required", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list):
        raise _wrong("messages", "an array of messages", messages)
    if not messages:
        raise bad("'messages' is empty; give at least one message", param="messages", code="empty_input")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _wrong(f"messages[{i}]", "an object with 'role' and 'content'", m)
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"messages[{i}].role {json.dumps(role)}: expected one of {', '.join(_ROLES)} (tools are not "
                      "supported)", param=f"messages[{i}].role")
        if m.get("tool_calls") or m.get("function_call"):
            raise bad(f"messages[{i}]: tool calls are not supported", param=f"messages[{i}]",
                      code="unsupported_parameter")
        out.append({"role": _ROLES[role], "content": _content(i, m)})
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise bad("'messages' holds no user message with text", param="messages", code="empty_input")
    max_tokens = _int(body, "max_completion_tokens", lo=1)
    max_tokens = _int(body, "max_tokens", lo=1) if max_tokens is None else max_tokens
    temperature = _num(body, "temperature")
    if temperature is not None and not 0 <= temperature <= 2:
        raise bad(f"'temperature' must be in [0, 2], got {temperature:g}", param="temperature")
    top_p = _num(body, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise bad(f"'top_p' must be in (0, 1], got {top_p:g}", param="top_p")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _wrong("stream_options", "an object", options)
    include_usage = _bool(options or {}, "include_usage", False)
    stream = _bool(body, "stream", False)
    return ChatBody(model=model, messages=out, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                    top_k=_int(body, "top_k", lo=0), repetition_penalty=_num(body, "repetition_penalty"),
                    seed=_int(body, "seed", 0), greedy=_bool(body, "greedy", False),
                    stream=stream, include_usage=include_usage, audio=_chat_audio(body, stream))
