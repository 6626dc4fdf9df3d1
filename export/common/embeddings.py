"""Write the bundle's embedding tables (``embeddings/*.npy``) from a loaded Qwen3-TTS model.

Tables (see docs/DESIGN.md, "Embedding tables"):

- ``text_embedding`` [text_vocab, text_hidden]: "bf16" (uint16 bit patterns) when every
  value is exactly bf16-representable (true for the released bf16 checkpoints), else
  "fp16" with a warning. Never fp32: the 151936 x 2048 table would be 1.2 GB.
- ``text_proj_fc{1,2}_{w,b}``: the text projection MLP, fp32, T(x) = fc2(silu(fc1(x))).
- ``codec_embedding`` [3072, H]: the talker codec embedding C(.), fp32.
- ``cp_codec_embedding`` [15, 2048, H]: the code predictor's codec embeddings, fp32. They
  are talker-hidden sized even when the code predictor is narrower (the
  ``small_to_mtp_projection`` is applied after the lookup). Written as a .npy here; once the graphs' weights are
  shared, the bundle writer turns it into a view into ``graphs/weights.data``, which holds the same bytes as the
  Code Predictor graphs' embeddings, and removes the .npy (``kztts.bundle.table_views``).

The big text table is written row-block by row-block (a .npy header, then sequential
writes) so the export holds at most one block of converted values besides the model.

A bundle with quantized weights gets compact tables (``kztts.bundle.table_compact``, from its fp32 bundle's).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from kztts.bundle.table_compact import BLOCK_ROWS, TABLE_DIR, save_table, table_rel
from kztts.core.atomic import atomic_path
from kztts.core.errors import KzttsError

log = logging.getLogger(__name__)



def _to_numpy_f32(t) -> np.ndarray:
    """A torch tensor (any float dtype) as a float32 numpy array (a view when already fp32 on CPU)."""
    import torch

    t = t.detach()
    if t.dtype != torch.float32:
        t = t.float()
    return t.cpu().numpy()




def bf16_exact(x: np.ndarray) -> bool:
    """True if every float32 value of ``x`` is exactly a bfloat16 value (low 16 bits zero)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return not np.any(x.view(np.uint32) & np.uint32(0xFFFF))


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 bit patterns of exactly-bf16 float32 values (truncation; callers check exactness)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def _write_text_table(weight, out_dir: Path) -> dict:
    """Stream the text embedding into a .npy as bf16 bits (or fp16 when not bf16-exact)."""
    rows, cols = (int(s) for s in weight.shape)
    exact = True
    for start in range(0, rows, BLOCK_ROWS):
        if not bf16_exact(_to_numpy_f32(weight[start:start + BLOCK_ROWS])):
            exact = False
            break
    name = "text_embedding"
    path = out_dir / table_rel(name)
    if exact:
        dtype, np_dtype = "bf16", np.uint16
    else:
        dtype, np_dtype = "fp16", np.float16
        log.warning("text embedding values are not bfloat16-representable (the checkpoint is not "
                    "bf16): storing them as fp16, prompt accuracy is reduced (~1e-3 relative)")
    # Sequential block writes after a standard .npy header: unlike writing through
    # open_memmap (whose dirty pages count towards RSS until written back: +600 MB for
    # the 1.7B table), this keeps the export's extra memory at one block. Never written in
    # place: a runtime may have the old table memory-mapped (see kztts.core.atomic).
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np_dtype)), "fortran_order": False,
              "shape": (rows, cols)}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, rows, BLOCK_ROWS):
            block = _to_numpy_f32(weight[start:start + BLOCK_ROWS])
            if exact:
                f.write(f32_to_bf16_bits(block).tobytes())
            else:
                with np.errstate(over="ignore"):
                    half = block.astype(np.float16)
                if np.any(np.isinf(half) & np.isfinite(block)):
                    raise KzttsError(f"{path}: text embedding values exceed the fp16 range; the "
                                     "checkpoint cannot be stored in a kztts bundle")
                f.write(half.tobytes())
    return {"file": table_rel(name), "dtype": dtype, "shape": [rows, cols]}


def export_embeddings(model, out_dir: Path) -> dict:
    """Write ``out_dir/embeddings/*.npy`` from a ``Qwen3TTSForConditionalGeneration``.

    Returns the manifest's ``embeddings`` dict ``{name: {file, dtype, shape}}``.
    """
    import torch

    out_dir = Path(out_dir)
    (out_dir / TABLE_DIR).mkdir(parents=True, exist_ok=True)
    talker = model.talker
    tc = model.config.talker_config
    hidden = int(tc.hidden_size)
    tables: dict[str, dict] = {}

    with torch.no_grad():
        text_w = talker.get_text_embeddings().weight
        if tuple(text_w.shape) != (tc.text_vocab_size, tc.text_hidden_size):
            raise KzttsError(f"text embedding is {tuple(text_w.shape)}, the config says "
                             f"({tc.text_vocab_size}, {tc.text_hidden_size}); the checkpoint is inconsistent")
        tables["text_embedding"] = _write_text_table(text_w, out_dir)

        proj = talker.text_projection
        act = type(proj.act_fn).__name__
        if act not in ("SiLU", "SiLUActivation"):
            raise KzttsError(f"text projection activation is {act}; kztts implements SiLU only "
                             f"(config hidden_act={tc.hidden_act!r})")
        for i, lin in ((1, proj.linear_fc1), (2, proj.linear_fc2)):
            if lin.bias is None:
                raise KzttsError(f"text projection linear_fc{i} has no bias; this is not a Qwen3-TTS 12 Hz model")
            tables[f"text_proj_fc{i}_w"] = save_table(out_dir, f"text_proj_fc{i}_w", _to_numpy_f32(lin.weight), "fp32")
            tables[f"text_proj_fc{i}_b"] = save_table(out_dir, f"text_proj_fc{i}_b", _to_numpy_f32(lin.bias), "fp32")
        if tables["text_proj_fc2_w"]["shape"][0] != hidden:
            raise KzttsError(f"text projection outputs {tables['text_proj_fc2_w']['shape'][0]}, "
                             f"the talker hidden size is {hidden}")

        codec = _to_numpy_f32(talker.get_input_embeddings().weight)
        if codec.shape != (tc.vocab_size, hidden):
            raise KzttsError(f"talker codec embedding is {codec.shape}, expected ({tc.vocab_size}, {hidden})")
        tables["codec_embedding"] = save_table(out_dir, "codec_embedding", codec, "fp32")

        cp_embs = talker.code_predictor.get_input_embeddings()
        n_groups = int(tc.num_code_groups)
        if len(cp_embs) != n_groups - 1:
            raise KzttsError(f"code predictor has {len(cp_embs)} codec embeddings, expected {n_groups - 1}")
        shapes = {tuple(e.weight.shape) for e in cp_embs}
        if len(shapes) != 1 or next(iter(shapes))[1] != hidden:
            raise KzttsError(f"code predictor codec embeddings have shapes {sorted(shapes)}; expected "
                             f"[vocab, {hidden}] (talker hidden) for all {n_groups - 1}")
        cp = np.stack([_to_numpy_f32(e.weight) for e in cp_embs])
        tables["cp_codec_embedding"] = save_table(out_dir, "cp_codec_embedding", cp, "fp32")
    return tables
