"""Make one Talker layer sensitive to 4-bit weights in a checkpoint (test models for the precision plan).

A random tiny model's weights are Gaussian: every layer loses about the same at 4 bits, so ``kztts calibrate``'s
per-layer SQNR would have nothing to tell apart. Real checkpoints have outlier channels: one input channel of a
MatMul whose weights are many times the rest, which per-column (and, within its block, LPBQ) scales then spread
over every other weight of the column. ``outlier_checkpoint`` rewrites layer ``L``'s MLP so, exactly:
``up_proj``'s output channel ``c`` is divided by ``scale`` and ``down_proj``'s input channel ``c`` multiplied by
it. The intermediate ``act(gate) * up`` is linear in ``up``, so the layer computes the same function in exact
arithmetic (an equivalence transform, as outlier-migration methods use in reverse), while ``down_proj``'s
column maxima are now ``scale`` times its other weights: its 4-bit codes collapse to a few levels, its 8-bit ones
keep enough.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

DEFAULT_SCALE = 16.0


def outlier_checkpoint(src: str | Path, dst: str | Path, layer: int, *, channel: int = 3,
                       scale: float = DEFAULT_SCALE) -> Path:
    """A copy of the Qwen3-TTS checkpoint ``src`` at ``dst`` (unchanged files hard-linked) with layer ``layer``'s
    ``down_proj`` holding an outlier input channel (module docstring). Returns ``dst``."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst, copy_function=_link_or_copy, dirs_exist_ok=True)
    weights = dst / "model.safetensors"
    tensors = load_file(str(src / "model.safetensors"))
    prefix = f"talker.model.layers.{layer}.mlp."
    up, down = tensors.get(prefix + "up_proj.weight"), tensors.get(prefix + "down_proj.weight")
    if up is None or down is None:
        raise ValueError(f"{src}: no talker layer {layer} MLP (keys {prefix}up_proj/down_proj.weight)")
    if not 0 <= channel < up.shape[0]:
        raise ValueError(f"channel {channel} out of range 0..{up.shape[0] - 1}")
    up, down = up.clone(), down.clone()
    with torch.no_grad():
        up[channel] /= scale  # Linear weight [out, in]: output channel c of up_proj
        down[:, channel] *= scale  # input channel c of down_proj
    tensors[prefix + "up_proj.weight"], tensors[prefix + "down_proj.weight"] = up, down
    weights.unlink()  # a hard link to the source: never write through it
    save_file(tensors, str(weights), metadata={"format": "pt"})
    note = dst / "kztts_tiny.json"
    info = json.loads(note.read_text()) if note.is_file() else {}
    note.unlink(missing_ok=True)
    note.write_text(json.dumps({**info, "weight_outlier": {"layer": layer, "channel": channel, "scale": scale}}))
    return dst


def _link_or_copy(a: str, b: str) -> None:
    try:
        os.link(a, b)
    except OSError:
        shutil.copy2(a, b)
