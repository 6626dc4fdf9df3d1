"""``kztts make-tiny --lm OUT``: the tests' tiny random Qwen3 LM bundle, so that ``kztts chat`` and ``chat --speak``
can be tried without a download: its replies are those of the tests' LM bundle, and TTS-only flags are refused in
one line."""
from __future__ import annotations

import soundfile as sf

from kztts.lm.lm import LM

from support import kztts_main, run_kztts


def test_make_tiny_lm_writes_a_bundle_chat_and_chat_speak_run(chat_bundle, equal_bundle, tmp_path, capsys):
    out = tmp_path / "lm"
    code, stdout, err = kztts_main(capsys, "make-tiny", "--lm", out)
    assert code == 0, err
    assert "RANDOM weights" in stdout and f"kztts chat {out}" in stdout
    reply = "".join(LM(chat_bundle).chat_session().send("Hello there.", 8, seed=0, greedy=True))
    chat = run_kztts("chat", out, "--greedy", "--max-new-tokens", 8, input="Hello there.\n")
    assert chat.returncode == 0 and reply and chat.stdout.startswith(reply), chat.stderr[-2000:]
    spoken = run_kztts("chat", out, "--greedy", "--max-new-tokens", 8, "--speak", "demo", "--speak-out",
                       tmp_path / "spoken", input="Hello there.\n")
    assert spoken.returncode == 0 and spoken.stdout.startswith(reply), spoken.stderr[-2000:]
    assert sf.read(tmp_path / "spoken" / "reply-01.wav")[0].size > 0


def test_make_tiny_lm_refuses_tts_flags_and_an_existing_folder(capsys, tmp_path):
    code, _, err = kztts_main(capsys, "make-tiny", "--lm", tmp_path / "a", "--kind", "custom_voice")
    assert code == 2 and "--kind describes a TTS checkpoint; --lm makes the tiny Qwen3 LM bundle" in err
    (tmp_path / "b").mkdir()
    code, _, err = kztts_main(capsys, "make-tiny", "--lm", tmp_path / "b")
    assert code == 2 and "already exists" in err and list(tmp_path.iterdir()) == [tmp_path / "b"]
