"""Spoken chat completions from ``kztts serve LM --tts TTS``, asked with the official openai client: one whole
(WAV) and one streamed (pcm16), their transcripts, audio and first audio printed, then the server's last log lines.

    python benchmarks/spoken_chat/serve_transcript.py LM TTS [--threads 2]
"""
from __future__ import annotations

import argparse
import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request

from openai import OpenAI

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("lm")
parser.add_argument("tts")
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()
lm, tts = args.lm, args.tts
env = dict(os.environ, KZTTS_THREADS=str(args.threads))
srv = subprocess.Popen([sys.executable, "-m", "kztts.cli.main", "serve", lm, "--tts", tts, "--port", "8765",
                        "--model-name", "qwen2.5-coder-1.5b+qwen3-tts-0.6b"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
try:
    for _ in range(600):
        try:
            if urllib.request.urlopen("http://127.0.0.1:8765/health").status == 200:
                break
        except OSError:
            pass
        time.sleep(0.5)
    client = OpenAI(base_url="http://127.0.0.1:8765/v1", api_key="unused")
    print(">>> client.models.list():", [(m.id, getattr(m, "kind", None)) for m in client.models.list().data])
    t0 = time.perf_counter()
    r = client.chat.completions.create(model="qwen2.5-coder-1.5b+qwen3-tts-0.6b", modalities=["text", "audio"],
                                       audio={"voice": "default", "format": "wav"}, seed=0, max_tokens=48,
                                       messages=[{"role": "user", "content": "What does a speech codec do? One sentence."}])
    wav = base64.b64decode(r.choices[0].message.audio.data)
    print(f">>> non-streamed, {time.perf_counter() - t0:.2f} s")
    print("id:", r.id, "| finish_reason:", r.choices[0].finish_reason, "| usage:", r.usage.model_dump())
    print("message.content:", r.choices[0].message.content)
    print("message.audio.transcript:", r.choices[0].message.audio.transcript)
    print("message.audio: id", r.choices[0].message.audio.id, "|", len(wav), "bytes of", wav[:4], wav[8:12])
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model="qwen2.5-coder-1.5b+qwen3-tts-0.6b", modalities=["text", "audio"],
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
    out = srv.communicate(timeout=60)[0]
    print(">>> server log (last lines):"); print("\n".join(out.splitlines()[-6:]))
