"""The study scripts behind the published figures (README.md's "Headline figures", benchmarks/README.md's
headline column) still run: each one end to end at tiny size (the tiny 0.6B-layout bundle, one thread, a few
frames), in a child process as its README runs it, its report checked for the figure it publishes. Speed is not
judged (a test cannot time on a shared host); what rots (an API the script calls, a renamed field) fails here."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import ROOT

# name: (script, arguments ({bundle}: the tiny bundle, {model}: its checkpoint, {lm}: the tiny Qwen3 chat bundle,
# {out}: a folder of the test's own), a line or key its report must hold)
SCRIPTS = {
    "ttfa": ("ttfa/ttfa_study.py", "{bundle} --threads 1 --rounds 1 --frames 4 --rtf-runs 1 --out {out}/ttfa.json",
             "TTFA p50"),
    "ttfa_written": ("ttfa/written_ttfa.py", "{bundle} --threads 1 --rounds 1 --texts 2 --frames 4 --rate 200",
                     "sentence / written"),
    "ttfa_cli": ("ttfa/cli_ttfa.py", "{bundle} --threads 1 --runs 1 --max-frames 2 --out {out}/cli.json",
                 "| warm-up |"),
    "spoken_chat": ("spoken_chat/spoken_chat.py", "{lm} {bundle} --threads 1 --turns 1 --max-new-tokens 6 "
                    "--out {out}/chat.json", "first audio"),
    "decoder_variants": ("decoder/bench_decoder.py", "--size tiny --threads 1 --chunk 4 --frames 8 --rounds 1 "
                         "--work {out}/work", "conv2d+tconv_as_conv+fold_snake"),
    "decoder_synth": ("decoder/bench_synth_decode.py", "{bundle} --frames 8 --chunks 4 --threads 1 --repeats 1",
                      "chunks of 4"),
    "decoder_int8_static": ("decoder/bench_int8_static.py", "{bundle} --frames 8 --rounds 1", "| int8-static |"),
    "streaming_pipeline": ("streaming_pipeline/bench_pipeline.py",
                           "{bundle} --configs seq:1/1,pipe:1/1 --frames 6 --rounds 1", "pipe:1/1"),
    "conv_rates": ("piper_decoder/paper_vs_aihub.py", "", "| sm8650 | Samsung Galaxy S24 |"),
    "paper_cost": ("precision_plan/paper_cost.py", "{bundle} --out {out}/pc --targets x_elite,sm8750", "Command:"),
    "batching_profile": ("batching/profile_batched.py", "{bundle} --batch 1,2 --frames 2 --threads 1", '"batches"'),
    "frame_profile": ("frame_profile/profile_frame.py", "{bundle} --threads 1 --frames 4", "ms/run"),
    "compact_tables": ("tables/compact_tables.py", "{bundle} --weights int8 --frames 2 --threads 1 --json {out}/t.json",
                       "| xvec_stream |"),
    "bundle_sizes": ("bundle_sizes/sizes.py", "{model} {bundle} --json {out}/sizes.json", "MB of weights: "),
    "serve": ("serve/bench_serve.py", "--bundle {bundle} --clients 1 --requests 2 --max-frames 4 --threads 1 "
              "--batch 2 --out {out}/serve.json", "ttfa"),
}


@pytest.fixture(scope="module")
def bundles(equal_bundle, chat_bundle):
    from kztts.export.tts.tiny import cached_tiny

    return {"bundle": equal_bundle, "lm": chat_bundle, "model": cached_tiny("equal")}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_study_script_runs_at_tiny_size(name, bundles, tmp_path):
    script, args, expect = SCRIPTS[name]
    argv = [a.format(out=tmp_path, **bundles) for a in args.split()]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *argv], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, f"{script}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = done.stdout + "".join(p.read_text() for p in tmp_path.glob("*.json"))
    assert expect in report, f"{script} no longer reports {expect!r}:\n{done.stdout[-3000:]}"
    for path in tmp_path.glob("*.json"):
        json.loads(path.read_text())  # what it writes is whole
