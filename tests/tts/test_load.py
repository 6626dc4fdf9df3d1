"""Load: 1,000 sequential syntheses in one process on the demo model keep memory flat.

The syntheses run in a child process that imports the runtime only (the demo bundle is built
here, with torch), so its RSS is that of an application using ``kztts.TTS``.
Slow (several minutes): ``python -m pytest -m slow -s tests/tts/test_load.py`` prints the figures."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

CALLS, WARMUP, MAX_GROWTH = 1000, 50, 0.05

_CHILD = """
import json, sys, time
import psutil
from kztts.core.audio import synthetic_voice
from kztts.tts.tts import TTS

bundle, calls, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
texts = ("Hello from kztts.", "A longer sentence, with a clause or two, to vary the prompt length.", "Hi.")
tts = TTS(bundle)
voice = tts.voice_from_wav(synthetic_voice(), 24000)
proc, rss = psutil.Process(), {}
started = time.perf_counter()
for i in range(1, calls + 1):
    text = texts[i % len(texts)]
    if i % 4 == 0:  # the stream path too: its decoder state and chunk lists must not pile up
        assert list(tts.stream(text, voice, seed=i, max_frames=20))
    else:
        assert tts.synthesize(text, voice, seed=i, max_frames=20).frames > 0
    if i in (warmup, calls // 2, calls):
        rss[i] = proc.memory_info().rss
print(json.dumps({"rss": rss, "seconds": time.perf_counter() - started, "torch": "torch" in sys.modules}))
"""


@pytest.mark.slow
def test_a_thousand_syntheses_keep_memory_flat(record_property):
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    bundle = cached_bundle(cached_tiny("equal"))  # the demo model (kztts synth without --bundle)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(bundle), str(CALLS), str(WARMUP)],
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["torch"], "the synthesis process imported torch"
    rss = {int(k): v / 2**20 for k, v in out["rss"].items()}
    growth = rss[CALLS] / rss[WARMUP] - 1
    line = (f"RSS after {WARMUP}: {rss[WARMUP]:.1f} MiB, after {CALLS // 2}: {rss[CALLS // 2]:.1f} MiB, "
            f"after {CALLS}: {rss[CALLS]:.1f} MiB, growth {growth * 100:+.2f} %, {out['seconds']:.0f} s")
    print(line)
    record_property("load", line)
    assert growth < MAX_GROWTH, line
