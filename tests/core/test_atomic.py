"""Atomic replacement (kztts.core.atomic) and the link-or-copy of bundle files, including what Windows refuses."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from kztts.core.atomic import atomic_path, replace, write_text
from kztts.core.errors import KzttsError


def _windows_refuses(monkeypatch):
    """os.replace as on Windows when the destination is open or memory-mapped."""
    def refuse(src, dst):
        raise PermissionError(13, "Access is denied", str(dst))

    monkeypatch.setattr(os, "replace", refuse)


def test_write_text_replaces_whole_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "kztts.json"
    p.write_text("old")
    old = os.umask(0o022)
    try:
        write_text(p, "new\n")
    finally:
        os.umask(old)
    assert p.read_text() == "new\n" and [f.name for f in tmp_path.iterdir()] == ["kztts.json"]
    if sys.platform != "win32":
        assert (p.stat().st_mode & 0o777) == 0o644


def test_a_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "t.npy"
    p.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(p) as tmp, open(tmp, "wb") as f:
            f.write(b"half")
            raise RuntimeError("disk full")
    assert p.read_bytes() == b"old" and [f.name for f in tmp_path.iterdir()] == ["t.npy"]


def test_a_destination_in_use_is_one_line_naming_it(tmp_path, monkeypatch):
    p = tmp_path / "text_embedding.npy"
    p.write_bytes(b"old")
    _windows_refuses(monkeypatch)
    with pytest.raises(KzttsError, match=r"cannot replace .*text_embedding\.npy: Access is denied; on Windows") as e:
        with atomic_path(p) as tmp:
            tmp.write_bytes(b"new")
    assert "\n" not in str(e.value)
    assert p.read_bytes() == b"old" and [f.name for f in tmp_path.iterdir()] == ["text_embedding.npy"]
    with pytest.raises(KzttsError, match="cannot replace"):
        replace(tmp_path / "a", tmp_path / "b")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX semantics: a mapped file's old inode stays alive")
def test_replacing_a_memory_mapped_table_keeps_the_mapping_valid(tmp_path):
    """Re-exporting a table this process has mapped (np.load mmap_mode='r'): the mapping keeps the old
    values (never truncated under it), a new load sees the new ones."""
    p = tmp_path / "text_embedding.npy"
    np.save(p, np.arange(1 << 16, dtype=np.uint16))
    mapped = np.load(p, mmap_mode="r")
    with atomic_path(p) as tmp, open(tmp, "wb") as f:
        np.save(f, np.zeros(8, np.uint16))
    assert int(mapped[-1]) == (1 << 16) - 1
    assert np.load(p).shape == (8,)


def test_staged_dir_in_use_is_one_line(tmp_path, monkeypatch):
    from kztts.core.build_cache import staged_dir

    out = tmp_path / "bundle"
    out.mkdir()
    (out / "kztts.json").write_text("{}")
    _windows_refuses(monkeypatch)
    with pytest.raises(KzttsError, match=r"cannot replace .*bundle"):
        with staged_dir(out) as work:
            (work / "kztts.json").write_text("{}")
    assert (out / "kztts.json").is_file()
    assert [f.name for f in tmp_path.iterdir()] == ["bundle"]  # the staging folder is gone


@pytest.mark.parametrize("across_fs", ["copy", "symlink"])
def test_link_tree_copies_when_no_link_can_be_made(tmp_path, monkeypatch, across_fs, caplog):
    """Windows without the symlink privilege, on a file system without hard links: copies."""
    pytest.importorskip("torch")
    from kztts.export.common.bundle_output import link_tree

    src, dst = tmp_path / "base", tmp_path / "new"
    (src / "graphs").mkdir(parents=True)
    (src / "graphs" / "talker.onnx").write_bytes(b"graph")
    (src / "skip.bin").write_bytes(b"x")
    (src / "kztts.json").write_text("{}")

    def no_link(*a, **k):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr(Path, "symlink_to", no_link)
    link_tree(src, dst, {"skip.bin"}, across_fs=across_fs)
    f = dst / "graphs" / "talker.onnx"
    assert f.read_bytes() == b"graph" and not f.is_symlink()
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*")) == ["graphs", "graphs/talker.onnx"]
    assert ("copied" in caplog.text) == (across_fs == "symlink")
