"""Committed files name no folder of the machine that wrote them: a report, a command or a doc read on
another machine must not point at the home, work or scratch folders of the one that made it (a merge
that opened such a path passed only on that machine; a report that names its scratch folder sends its
reader to a file that is not there)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from support import ROOT

# Home, work and scratch folders of a machine (Linux, macOS, Windows). Spelt in pieces so this file does
# not match.
MACHINE_PATH = re.compile("(?<![\\w.$~-])(/" + "root/|/" + "home/[\\w.-]+/|/" + "Users/[\\w.-]+/|/" + "work/|/"
                          + "mnt/[\\w.-]+/|/" + "tmp/|/" + "var/|/" + "private/|[A-Za-z]:\\\\" + "Users\\\\)")


def machine_paths(text: str) -> list[str]:
    """``line: path`` for every absolute path of a machine's own folders in ``text``."""
    return [f"{n}: {m.group(0)}" for n, line in enumerate(text.splitlines(), 1) for m in MACHINE_PATH.finditer(line)]


def test_the_scanner_finds_machine_paths():
    text = ('"bundle": "/' + 'work/runs/q15/B",\n--gguf /' + 'root/.cache/x.gguf\nC:\\' + 'Users\\me\\b\n'
            '"placement": "/' + 'tmp/hy/guarded.json"\n--out /' + 'var/folders/x --cache /' + 'home/me/.cache\n'
            "$KZTTS_CACHE/checkpoints/x.gguf ~/.cache/kztts runtime/bench/lm.py out/tmp/x https://a.b/var/c/")
    assert machine_paths(text) == ["1: /" + "work/", "2: /" + "root/", "3: C:\\" + "Users\\", "4: /" + "tmp/",
                                   "5: /" + "var/", "5: /" + "home/me/"]


def test_no_committed_file_names_a_machine_path():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the committed files are not known")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    found = []
    for name in filter(None, files.decode().split("\0")):
        path = ROOT / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files carry no paths worth reading; a file deleted in the work tree is gone
        found += [f"{name}:{hit}" for hit in machine_paths(text)]
    assert not found, "machine paths in committed files (use $KZTTS_CACHE/..., ~/..., or a relative path):\n" \
        + "\n".join(found)
