"""torch -> ONNX for the wrapper modules, checked by ONNX Runtime right after export."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

log = logging.getLogger(__name__)

OPSET = 17


def export_onnx(module: torch.nn.Module, example_inputs: tuple, path: Path, input_names: list[str],
                output_names: list[str], dynamic_axes: dict[str, dict[int, str]] | None = None) -> Path:
    """Export with the TorchScript exporter.

    The wrappers are plain tensor code over the reference weights, which this
    exporter turns into compact graphs without transformers' mask machinery; the
    dynamo exporter cannot take ``dynamic_axes`` for variadic KV inputs.
    Graphs over 2 GB are written with external data next to ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript-exporter deprecation and tracer notes
        torch.onnx.export(module, example_inputs, str(path), input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes or {},
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
    log.info("exported %s (%.1f MB)", path.name, path.stat().st_size / 1e6)
    return path
