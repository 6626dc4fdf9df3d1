"""``kztts synth - -o out.wav``: the text read from standard input as it arrives (a pipe written in pieces, with
pauses) and spoken while it comes: the codes equal ``kztts synth TEXT --streaming-text``'s, the time to first
audio is counted from the first text byte, and bad input is one line with no file written."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

TEXT = "Hello from a pipe, spoken while it comes."


def synth_from_pipe(pieces: list[bytes], *args, pause: float = 0.2) -> subprocess.CompletedProcess:
    """``kztts synth - ARGS`` with ``pieces`` written to its standard input one by one, ``pause`` seconds apart."""
    proc = subprocess.Popen([sys.executable, "-m", "kztts.cli.main", "synth", "-", *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for piece in pieces:
        time.sleep(pause)
        proc.stdin.write(piece)
        proc.stdin.flush()
    proc.stdin.close()
    proc.stdin = None  # closed: communicate only reads
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def test_piped_text_gives_the_whole_text_s_codes(equal_bundle, voice_wav, tmp_path):
    from support import run_kztts

    common = ["--bundle", equal_bundle, "--speaker-wav", voice_wav, "--language", "english", "--greedy",
              "--max-frames", 14]
    whole = run_kztts("synth", TEXT, "-o", tmp_path / "whole.wav", "--streaming-text", "--codes-out",
                      tmp_path / "whole.npy", *common)
    assert whole.returncode == 0, whole.stderr
    # cut inside a word and inside a multi-byte character: the reader decodes UTF-8 across reads
    text = TEXT.replace("pipe", "pïpe").encode()
    cut = text.index("ï".encode()) + 1
    piped = synth_from_pipe([text[:5], text[5:cut], text[cut:]], "-o", tmp_path / "piped.wav", "--codes-out",
                            tmp_path / "piped.npy", *common, "--stream")
    assert piped.returncode == 0, piped.stderr
    assert "time to first audio" in piped.stdout and "(from the first text byte)" in piped.stdout
    whole_pipe = run_kztts("synth", TEXT.replace("pipe", "pïpe"), "-o", tmp_path / "w2.wav", "--streaming-text",
                           "--codes-out", tmp_path / "w2.npy", *common)
    assert whole_pipe.returncode == 0, whole_pipe.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "piped.npy"), np.load(tmp_path / "w2.npy"))
    assert not np.array_equal(np.load(tmp_path / "whole.npy"), np.load(tmp_path / "w2.npy"))  # the text matters


@pytest.mark.parametrize("stdin,message", [(b"", "the text is empty"), (b"  \n", "the text is empty"),
                                           (b"caf\xe9 latin-1", "not UTF-8")], ids=["empty", "blank", "latin-1"])
def test_bad_standard_input_is_one_line_and_no_file(equal_bundle, voice_wav, tmp_path, stdin, message):
    res = synth_from_pipe([stdin], "-o", tmp_path / "x.wav", "--bundle", equal_bundle, "--speaker-wav", voice_wav,
                          pause=0)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "x.wav").exists()


def test_as_reply_with_standard_input_is_refused_before_work(tmp_path):
    from support import run_kztts

    res = run_kztts("synth", "-", "-o", tmp_path / "x.wav", "--as-reply", stdin=subprocess.DEVNULL)
    assert res.returncode == 2 and "--as-reply cannot be combined with TEXT '-'" in res.stderr
