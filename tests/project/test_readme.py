"""README.md stays a front door, and its Python example runs: the first ```python block, with its
placeholder bundles replaced by the tiny test bundles, speaks a WAV and gets a chat reply."""
from __future__ import annotations

import re

import pytest

from support import ROOT

README = ROOT / "README.md"
FIRST_COMMANDS = ['bash scripts/setup.sh && .venv/bin/kztts synth "Hello from kztts." -o hello.wav',
                  ".venv/bin/python -m pytest -q"]
MAX_LINES = 150
# the example's placeholders: what a user replaces with their own bundles
TTS_BUNDLE, LM_BUNDLE, VOICE_WAV = "my-tts-bundle", "my-lm-bundle", "voice.wav"


def blocks(language: str) -> list[str]:
    """The README's fenced code blocks of ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", README.read_text(encoding="utf-8"), re.S | re.M)


def test_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES, f"README.md has {len(text.splitlines())} lines; keep it to {MAX_LINES}"
    assert text.startswith("# kztts\n")
    assert blocks("bash")[0].splitlines() == FIRST_COMMANDS


def test_readme_names_every_variable_the_runtime_reads():
    """Each ``KZTTS_*`` variable the runtime reads (a string literal under runtime/, or a sampling override) is a row of
    the README's "Environment variables" table (KZTTS_API_KEY, ``kztts serve``'s key, once was not)."""
    from kztts.generation.settings import SAMPLING_FLAGS

    read = {m for f in (ROOT / "runtime").rglob("*.py") for m in re.findall(r"[\"'](KZTTS_[A-Z_]+)[\"']", f.read_text())}
    read |= set(SAMPLING_FLAGS.values())
    table = README.read_text(encoding="utf-8").split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"`(KZTTS_[A-Z_]+)`", table))
    assert "KZTTS_API_KEY" in read and read - rows == set()


def test_readme_links_point_at_files():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links
    missing = [link for link in links if "://" not in link and not (README.parent / link).exists()]
    assert not missing, missing


@pytest.fixture(scope="module")
def readme_bundles():
    """Plain exports, as the example's comments make them: the tiny random TTS ('equal' variant) and
    the tiny random Qwen2 LM (the cached builds tests/conftest.py and tests/lm/test_lm.py use)."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle
    from kztts.export.lm.tiny import cached_tiny_lm
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny("equal")), cached_lm_bundle(cached_tiny_lm("qwen2"))


def test_readme_python_example_speaks_and_chats(readme_bundles, tmp_path, monkeypatch, capsys):
    import numpy as np
    import soundfile as sf

    from kztts.core.audio import synthetic_voice, write_wav
    from kztts.lm.lm import ChatSession
    from kztts.tts.tts import SynthesisResult

    example = blocks("python")[0]
    assert "from kztts import TTS, LM" in example
    tts_bundle, lm_bundle = readme_bundles
    for placeholder, real in ((TTS_BUNDLE, tts_bundle), (LM_BUNDLE, lm_bundle)):
        assert f'"{placeholder}"' in example, f"the README example no longer opens {placeholder!r}"
        example = example.replace(f'"{placeholder}"', repr(str(real)))
    assert f'"{VOICE_WAV}"' in example
    monkeypatch.chdir(tmp_path)  # the example reads voice.wav and writes its WAV in the current folder
    write_wav(VOICE_WAV, synthetic_voice(), 24000)

    namespace: dict = {"__name__": "__readme__"}
    exec(compile(example, "README.md (python example)", "exec"), namespace)
    printed = capsys.readouterr().out

    results = [v for v in namespace.values() if isinstance(v, SynthesisResult)]
    assert len(results) == 1 and results[0].samples.size > 0 and results[0].sample_rate == 24000
    written = [p for p in tmp_path.glob("*.wav") if p.name != VOICE_WAV]
    assert len(written) == 1, written
    audio, sr = sf.read(written[0], dtype="float32")
    assert sr == results[0].sample_rate and audio.shape == results[0].samples.shape and np.abs(audio).max() > 0

    sessions = [v for v in namespace.values() if isinstance(v, ChatSession)]
    assert len(sessions) == 1 and len(sessions[0].replies) == 1
    reply = sessions[0].replies[0]
    assert reply.ids and reply.stopped_by in ("stop", "max_new_tokens")
    assert printed == reply.text  # the streamed pieces, printed, are the reply
