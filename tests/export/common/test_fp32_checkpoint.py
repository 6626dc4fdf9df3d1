"""``kztts.export.common.checkpoint.fp32_checkpoint``: a checkpoint stored in bf16 (as the released ones are) is
widened to fp32 on disk for an export, so that the model's weights are the mapped file, not a copy in memory, and
the weights are exactly those transformers' own fp32 load gives."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from kztts.core.errors import KzttsError
from kztts.export.common.checkpoint import fp32_checkpoint, load_reference
from kztts.export.tts.tiny import cached_tiny


def _bf16_copy(src: Path, dst: Path) -> Path:
    """The tiny checkpoint with its float weights stored in bf16 (the speech tokenizer's too)."""
    shutil.copytree(src, dst)
    for f in dst.rglob("*.safetensors"):
        tensors = load_file(f)
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}, f,
                  metadata={"format": "pt"})
    return dst


def _mapped(path: Path) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(str(path)) for line in f)


def test_a_bf16_checkpoint_loads_widened_mapped_and_equal_to_transformers_own_fp32(tmp_path, monkeypatch):
    from kztts.export.common import checkpoint

    monkeypatch.setattr(checkpoint, "_WIDEN_BLOCK", 1002)  # tensors widened in many blocks, as the big ones are
    ckpt = _bf16_copy(cached_tiny("equal"), tmp_path / "bf16")
    staging = tmp_path / "staging"
    staging.mkdir()
    ours = load_reference(ckpt, staging=staging).model
    theirs = load_reference(ckpt).model  # transformers converts while loading: a copy in memory
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    assert (staging / "model.safetensors").stat().st_size > (ckpt / "model.safetensors").stat().st_size * 1.9
    assert (staging / "config.json").is_symlink() and (staging / "speech_tokenizer" / "config.json").is_symlink()
    if os.path.exists("/proc/self/maps"):
        assert _mapped((staging / "model.safetensors").resolve())


def test_an_fp32_checkpoint_is_used_as_it_is_and_a_damaged_one_fails_in_one_line(tmp_path):
    tiny = cached_tiny("equal")
    assert fp32_checkpoint(tiny, tmp_path / "unused") == tiny and not (tmp_path / "unused").exists()
    ckpt = _bf16_copy(tiny, tmp_path / "bf16")
    f = ckpt / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(KzttsError, match=r"model\.safetensors: ends inside tensor .*download it again"):
        fp32_checkpoint(ckpt, tmp_path / "staging")
