"""kztts.core.build_cache: one build per key under a file lock, staged and published atomically."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kztts.core.build_cache import build_once, code_key, staged_dir


def _leftovers(root: Path) -> list[str]:
    """What a build left next to its result, lock files aside."""
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))


def test_two_threads_build_once(tmp_path):
    calls = []

    def build(work: Path) -> None:
        calls.append(threading.get_ident())
        time.sleep(0.3)  # long enough for the other thread to arrive while this one builds
        (work / "kztts.json").write_text("{}")

    dest = tmp_path / "cache" / "thing-abc"
    results = []
    threads = [threading.Thread(target=lambda: results.append(build_once(dest, build))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [dest, dest] and (dest / "kztts.json").is_file()
    assert _leftovers(dest.parent) == ["thing-abc"]


_CHILD = """
import sys, time
from pathlib import Path
from kztts.core.build_cache import build_once

def build(work):
    with open(sys.argv[2], "a") as log:
        log.write("built\\n")
    time.sleep(0.5)
    (work / "kztts.json").write_text("{}")

print(build_once(Path(sys.argv[1]), build))
"""


def test_two_processes_build_once(tmp_path):
    dest, log = tmp_path / "thing", tmp_path / "builds.txt"
    cmd = [sys.executable, "-c", _CHILD, str(dest), str(log)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [str(dest), str(dest)]
    assert log.read_text() == "built\n"


def test_failed_build_leaves_nothing_and_the_next_call_rebuilds(tmp_path):
    dest = tmp_path / "thing"

    def broken(work: Path) -> None:
        (work / "half.onnx").write_bytes(b"x")
        raise RuntimeError("killed halfway")

    with pytest.raises(RuntimeError, match="killed halfway"):
        build_once(dest, broken)
    assert _leftovers(tmp_path) == []

    def no_marker(work: Path) -> None:
        (work / "graph.onnx").write_bytes(b"x")

    with pytest.raises(RuntimeError, match="did not write kztts.json"):
        build_once(dest, no_marker)
    assert _leftovers(tmp_path) == []

    build_once(dest, lambda work: (work / "kztts.json").write_text("{}"))
    assert sorted(p.name for p in dest.iterdir()) == ["kztts.json"]


def test_stale_staging_and_replaced_builds_are_removed(tmp_path):
    (tmp_path / ".thing-new.tmp-killed").mkdir()  # a build killed before it published
    (tmp_path / "thing-old").mkdir()  # the same thing from older code
    (tmp_path / "other").mkdir()
    build_once(tmp_path / "thing-new", lambda w: (w / "kztts.json").write_text("{}"), replaces="thing-*")
    assert _leftovers(tmp_path) == ["other", "thing-new"]


def test_changing_the_code_key_rebuilds(tmp_path):
    src = tmp_path / "builder.py"
    src.write_text("VERSION = 1\n")
    built = []

    def cached() -> Path:
        dest = tmp_path / "cache" / f"thing-{code_key(src)}"
        return build_once(dest, lambda w: (built.append(w.name), (w / "kztts.json").write_text("{}")))

    first = cached()
    assert cached() == first and len(built) == 1
    src.write_text("VERSION = 2\n")
    second = cached()
    assert second != first and len(built) == 2 and (second / "kztts.json").is_file()


def test_code_key_covers_files_modules_and_options(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    key = code_key(a, b)
    assert len(key) == 12 and len(code_key(a, length=8)) == 8
    assert code_key(a, b) == key and code_key(b, a) != key
    assert code_key(a, b, extra=b"int4") != key
    import kztts.core.cache

    assert code_key(kztts.core.cache) == code_key(kztts.core.cache.__file__)


def test_staged_dir_replaces_a_directory_whole_or_not_at_all(tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "old.onnx").write_text("old")
    with pytest.raises(ValueError):
        with staged_dir(out) as work:
            (work / "new.onnx").write_text("new")
            raise ValueError
    assert [p.name for p in out.iterdir()] == ["old.onnx"]
    with staged_dir(out) as work:
        assert work.name == out.name and not any(work.iterdir())
        (work / "new.onnx").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.onnx"]
    assert _leftovers(tmp_path) == ["bundle"]
