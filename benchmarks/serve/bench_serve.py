"""Load on a live ``kztts serve``: 1, 2, 4, 8 concurrent clients, each asking for streamed speech (pcm) or,
with ``--chat``, a streamed chat completion, in a closed loop, against one client at a time in the same run
(same server, same requests).

Per level: aggregate audio seconds (chat: completion tokens) per wall second, p50/p95 time to first audio
byte (chat: first token) and total latency, the 1-minute load average before and after (the machine may be
shared), and the server process's CPU seconds (user + system): output per CPU second is what batching
saves, whatever share of the cores other jobs leave it.

    python benchmarks/serve/bench_serve.py [--bundle B] [--clients 1,2,4,8] [--threads 2] [--batch 8]
        [--max-frames 60] [--decoder-threads N] [--out results.json]
    python benchmarks/serve/bench_serve.py --chat --bundle LM_BUNDLE [--clients 1,2,4] [--max-tokens 64] ...

Without ``--bundle`` it builds (once, cached) the random-weight 0.6B and its int8 variant.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

TEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Please remember to bring your umbrella, the forecast says rain this afternoon.",
    "Our meeting has moved to Thursday at three o'clock in the small conference room.",
    "A gentle breeze carried the smell of fresh bread from the bakery down the street.",
    "The library will be closed on Monday for the annual inventory of its collection.",
    "Turn left at the second traffic light, then continue straight for two kilometres.",
    "She played the piano every evening, and the neighbours opened their windows to listen.",
    "Scientists announced the discovery of a new species of frog in the rainforest.",
]


# Chat prompts that ask for more than --max-tokens tokens, so each reply is cut at the same length
PROMPTS = [
    "Write a Python function that merges two sorted lists, and explain how it works step by step.",
    "Explain in detail how a hash table handles collisions, with an example in C.",
    "Describe the water cycle for a school lesson, covering every stage at length.",
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "List the steps to set up a Python project with tests and continuous integration, explaining each.",
    "Explain how public-key cryptography works and why it is hard to break, in detail.",
    "Write a Rust program that reads a file line by line and counts the words, with comments.",
    "Compare three sorting algorithms, their complexity and when to use each, at length.",
]


def default_bundle() -> Path:
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny
    from kztts.export.common.variants import cached_variant

    return cached_variant(cached_bundle(cached_tiny(size="0.6b")), weights="int8")


def start(bundle: Path, args, log: Path, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """``kztts serve BUNDLE --port 0 ... EXTRA`` (``args``: threads, decoder_threads, batch), its stderr to ``log``:
    (the process, its URL from the line it prints when listening)."""
    env = {**os.environ, "KZTTS_THREADS": str(args.threads)}
    if args.decoder_threads is not None:
        env["KZTTS_DECODER_THREADS"] = str(args.decoder_threads)
    cmd = [sys.executable, "-m", "kztts.cli.main", "serve", str(bundle), "--port", "0", "--batch", str(args.batch),
           "--queue", "64", *extra]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 1)[0]:
            line = proc.stdout.readline()
            match = re.search(r"http://([0-9.]+):(\d+)", line)
            if match:
                return proc, match.group(0)
            break
    proc.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()[-3000:]}")


def connect(url: str, timeout: float = 600) -> http.client.HTTPConnection:
    """A connection to the server at ``url`` (``http://HOST:PORT``)."""
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def speak(url: str, text: str, seed: int, max_frames: int) -> dict:
    """One streamed pcm request: seconds to the first audio byte, to the end, and the audio seconds."""
    conn = connect(url)
    body = json.dumps({"model": "tts-1", "input": text, "seed": seed, "max_frames": max_frames,
                       "response_format": "pcm"})
    sent = time.perf_counter()
    conn.request("POST", "/v1/audio/speech", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:300]!r}")
    first, size = None, 0
    while True:
        chunk = r.read1(1 << 16)
        if not chunk:
            break
        if first is None:
            first = time.perf_counter() - sent
        size += len(chunk)
    conn.close()
    return {"ttfa": first, "total": time.perf_counter() - sent, "audio": size / 2 / 24000}


def served_model(url: str) -> str:
    """The model name ``GET /v1/models`` lists first (a chat request must name it)."""
    conn = connect(url, timeout=60)
    conn.request("GET", "/v1/models")
    models = json.loads(conn.getresponse().read())["data"]
    conn.close()
    return models[0]["id"]


def chat(url: str, model: str, prompt: str, seed: int, max_tokens: int) -> dict:
    """One streamed chat completion: seconds to the first content chunk, to ``[DONE]``, and the completion
    tokens the server counted (``stream_options.include_usage``)."""
    conn = connect(url)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "seed": seed,
                       "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}})
    sent = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:300]!r}")
    first, tokens = None, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if first is None and any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
            first = time.perf_counter() - sent
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    conn.close()
    if tokens is None:
        raise RuntimeError("the stream ended without a usage chunk")
    return {"ttfa": first, "total": time.perf_counter() - sent, "audio": tokens}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its threads."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def level(url: str, clients: int, per_client: int, ask, pid: int) -> dict:
    """``clients`` threads, ``per_client`` requests each; ``ask(i)`` sends request ``i``. In a chat run the
    ``audio`` fields hold completion tokens and ``ttfa`` the time to the first token."""
    results: list[dict] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for j in range(per_client):
            out = ask(k * per_client + j)
            with lock:
                results.append(out)

    load_before = psutil.getloadavg()[0]
    cpu_before = cpu_seconds(pid)
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    cpu = cpu_seconds(pid) - cpu_before
    ttfa = np.array([r["ttfa"] for r in results])
    total = np.array([r["total"] for r in results])
    audio = sum(r["audio"] for r in results)
    return {"clients": clients, "requests": len(results), "wall_s": round(wall, 2), "audio_s": round(audio, 2),
            "audio_s_per_s": round(audio / wall, 3), "server_cpu_s": round(cpu, 1),
            "audio_s_per_cpu_s": round(audio / cpu, 3), "cpu_share": round(cpu / wall, 2),
            "ttfa_p50_s": round(float(np.percentile(ttfa, 50)), 3),
            "ttfa_p95_s": round(float(np.percentile(ttfa, 95)), 3),
            "total_p50_s": round(float(np.percentile(total, 50)), 3),
            "total_p95_s": round(float(np.percentile(total, 95)), 3),
            "load_before": round(load_before, 2), "load_after": round(psutil.getloadavg()[0], 2)}


def chat_names(row: dict) -> dict:
    """A chat level's row with its fields named for tokens: audio_s -> tokens, ttfa -> ttft."""
    return {k.replace("audio_s", "tokens").replace("ttfa", "ttft"): v for k, v in row.items()}


def table(rows: list[dict], chat: bool = False) -> str:
    base = rows[0]
    out, first = ("tokens", "TTFT") if chat else ("audio s", "TTFA")
    lines = [(f"| clients | requests | {out} / wall s | vs 1 client | {first} p50 s | {first} p95 s | p95 vs 1 client | "
              f"total p50 s | total p95 s | {out} / server CPU s | vs 1 client | server CPU share | "
              "load avg before / after |"),
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['clients']} | {r['requests']} | {r['audio_s_per_s']:.3f} | "
                     f"{r['audio_s_per_s'] / base['audio_s_per_s']:.2f}x | {r['ttfa_p50_s']:.2f} | "
                     f"{r['ttfa_p95_s']:.2f} | "
                     f"{r['ttfa_p95_s'] / base['ttfa_p95_s']:.2f}x | {r['total_p50_s']:.2f} | {r['total_p95_s']:.2f} | "
                     f"{r['audio_s_per_cpu_s']:.3f} | {r['audio_s_per_cpu_s'] / base['audio_s_per_cpu_s']:.2f}x | "
                     f"{r['cpu_share']:.2f} | {r['load_before']:.2f} / {r['load_after']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", help="TTS bundle (default: the random-weight 0.6B, int8 weights, built once); "
                   "with --chat an LM bundle")
    p.add_argument("--chat", action="store_true", help="streamed chat completions instead of speech")
    p.add_argument("--max-tokens", type=int, default=64, help="--chat: completion tokens per request")
    p.add_argument("--clients", default="1,2,4,8")
    p.add_argument("--requests", type=int, default=8, help="requests per level (at least 2 per client)")
    p.add_argument("--max-frames", type=int, default=60, help="frames per request (12.5 per audio second)")
    p.add_argument("--threads", type=int, default=2, help="KZTTS_THREADS of the server")
    p.add_argument("--decoder-threads", type=int, help="KZTTS_DECODER_THREADS of the server")
    p.add_argument("--batch", type=int, default=8, help="the server's --batch")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    if args.chat and not args.bundle:
        p.error("--chat needs --bundle: an LM bundle (kztts fetch-lm, then kztts export --gguf)")
    bundle = Path(args.bundle) if args.bundle else default_bundle()
    log = Path(args.out or "bench_serve").with_suffix(".server.log")
    proc, url = start(bundle, args, log)
    try:
        if args.chat:
            model = served_model(url)
            chat(url, model, "Say hello.", 0, 4)
            ask = lambda i: chat(url, model, PROMPTS[i % len(PROMPTS)], 1000 + i, args.max_tokens)  # noqa: E731
        else:
            speak(url, "A warm-up request.", 0, 12)
            ask = lambda i: speak(url, TEXTS[i % len(TEXTS)], 1000 + i, args.max_frames)  # noqa: E731
        rows = []
        for clients in (int(c) for c in args.clients.split(",")):
            rows.append(level(url, clients, max(2, args.requests // clients), ask, proc.pid))
            print(json.dumps(chat_names(rows[-1]) if args.chat else rows[-1]), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=300)
    size = f"max_tokens {args.max_tokens}" if args.chat else f"max_frames {args.max_frames}"
    print(f"\nbundle {bundle.name}; threads {args.threads}; batch {args.batch}; {size}; server exit {code}\n")
    print(table(rows, chat=args.chat))
    if args.out:
        Path(args.out).write_text(json.dumps({"bundle": bundle.name, "mode": "chat" if args.chat else "speech",
                                              "threads": args.threads, "batch": args.batch,
                                              "max_frames": args.max_frames, "max_tokens": args.max_tokens,
                                              "decoder_threads": args.decoder_threads,
                                              "cpus": os.cpu_count(),
                                              "rows": [chat_names(r) for r in rows] if args.chat else rows},
                                             indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
