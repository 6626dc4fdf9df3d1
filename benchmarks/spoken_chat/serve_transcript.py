"""Spoken chat completions from ``kztts serve LM --tts TTS``, asked with the official openai client: one whole
(WAV) and one streamed (pcm16), their transcripts, audio and first audio printed, then the server's last log lines.

    python benchmarks/spoken_chat/serve_transcript.py LM TTS [--threads 2]
"""
from __future__ import annotations

import argparse
import base64
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from bench_serve import start  # noqa: E402  (the serve bench's server start, a sibling folder)

MODEL = "qwen2.5-coder-1.5b+qwen3-tts-0.6b"
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("lm")
parser.add_argument("tts")
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()
log = Path(tempfile.mkdtemp(prefix="kztts-serve-")) / "serve.log"
srv, url = start(Path(args.lm), SimpleNamespace(threads=args.threads, decoder_threads=None, batch=4), log,  # serve's default batch
                 ("--tts", args.tts, "--model-name", MODEL))
try:
    client = OpenAI(base_url=url + "/v1", api_key="unused")
    print(">>> client.models.list():", [(m.id, getattr(m, "kind", None)) for m in client.models.list().data])
    t0 = time.perf_counter()
    r = client.chat.completions.create(model=MODEL, modalities=["text", "audio"],
                                       audio={"voice": "default", "format": "wav"}, seed=0, max_tokens=48,
                                       messages=[{"role": "user", "content": "What does a speech codec do? One sentence."}])
    wav = base64.b64decode(r.choices[0].message.audio.data)
    print(f">>> non-streamed, {time.perf_counter() - t0:.2f} s")
    print("id:", r.id, "| finish_reason:", r.choices[0].finish_reason, "| usage:", r.usage.model_dump())
    print("message.content:", r.choices[0].message.content)
    print("message.audio.transcript:", r.choices[0].message.audio.transcript)
    print("message.audio: id", r.choices[0].message.audio.id, "|", len(wav), "bytes of", wav[:4], wav[8:12])
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=MODEL, modalities=["text", "audio"],
                                            audio={"voice": "default", "format": "pcm16"}, seed=0, max_tokens=48,
                                            stream=True, messages=[{"role": "user", "content": "Name the capital of France in one sentence."}])
    first_audio, text, pcm = None, [], 0
    for chunk in stream:
        if not chunk.choices:
            continue
        audio = getattr(chunk.choices[0].delta, "audio", None)
        if audio:
            if getattr(audio, "transcript", None):
                text.append(audio.transcript)
            if getattr(audio, "data", None):
                pcm += len(base64.b64decode(audio.data))
                if first_audio is None:
                    first_audio = time.perf_counter() - t0
    print(f">>> streamed: transcript {''.join(text)!r}; {pcm} bytes of pcm16 = {pcm / 48000:.2f} s of audio; "
          f"first audio after {first_audio * 1000:.0f} ms")
finally:
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=60)
    print(">>> server log (last lines):")
    print("\n".join(log.read_text().splitlines()[-6:]))
