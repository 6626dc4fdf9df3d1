"""ConvTranspose nodes the HTP computes wrongly, and a rewrite it computes right.

On the simulated HTP (onnxruntime-qnn 2.7.0, QNN SDK 2.51, fp16 and w8a16 alike) a ConvTranspose with a
nonzero ``output_padding`` is wrong (``tests/export/htp/test_tconv_rewrite.py``, docs/QNN_EP.md):

- depthwise (``group`` == channels): the whole output comes out **one sample late** (about -2 dB against the CPU
  EP, 68-70 dB once shifted by one sample), whatever the kernel, stride and pads;
- grouped (1 < ``group`` < channels) with pads 0: wrong at the edge (about 39 dB);
- ``group`` 1 or 2 with asymmetric pads (e.g. 1/0): the process dies in the backend (segmentation fault).

The same nodes with ``output_padding`` 0 agree with the CPU EP to fp16 precision at every pads and group tried.
So :func:`rewrite_output_padding` writes each such node as a ConvTranspose with pads and ``output_padding`` 0 and
then the trim the attributes meant: the ``output_padding`` samples appended at the end (they receive no input,
only the bias), ``pads`` cut from each side. When ``output_padding`` does not exceed the end pad on any axis the
appended samples are all cut again, so the rewrite is a ConvTranspose and a Slice; otherwise the ConvTranspose
loses its bias, a Pad appends the zeros and the bias is added after the Slice.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_INT_MAX = np.iinfo(np.int64).max


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def needs_rewrite(node) -> bool:
    """True for a ConvTranspose the HTP computes wrongly: any nonzero ``output_padding``."""
    return node.op_type == "ConvTranspose" and any(int(v) for v in _attrs(node).get("output_padding", []))


def rewrite_output_padding(model) -> list[str]:
    """Rewrite, in place, every ConvTranspose of ``model`` (an ``onnx.ModelProto``) that :func:`needs_rewrite`;
    returns the rewritten node names. Nodes with ``auto_pad`` or ``output_shape`` (their padding is derived,
    not written), or whose bias must move but is not an initializer, are left as they are, with a warning."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    done: list[str] = []
    out_nodes = []
    for i, node in enumerate(g.node):
        if not needs_rewrite(node):
            out_nodes.append(node)
            continue
        a = _attrs(node)
        name = node.name or f"ConvTranspose_{i}"
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or a.get("output_shape"):
            log.warning("%s: ConvTranspose with auto_pad/output_shape and output_padding is left as is", name)
            out_nodes.append(node)
            continue
        op = [int(v) for v in a["output_padding"]]
        nd = len(op)
        pads = [int(v) for v in a.get("pads", [0] * 2 * nd)]
        begin, end = pads[:nd], pads[nd:]
        has_bias = len(node.input) > 2 and node.input[2]
        extra = [max(o - e, 0) for o, e in zip(op, end)]  # samples past the full output a Pad must append
        move_bias = has_bias and any(extra)
        if move_bias and node.input[2] not in inits:
            log.warning("%s: ConvTranspose bias is not an initializer; left as is", name)
            out_nodes.append(node)
            continue
        keep = {k: v for k, v in a.items() if k not in ("pads", "output_padding")}
        y = node.output[0]
        t_in = list(node.input[:2]) + ([] if move_bias or not has_bias else [node.input[2]])
        cur = f"{name}/full"
        out_nodes.append(helper.make_node("ConvTranspose", t_in, [cur], name=f"{name}/full", **keep))
        if any(extra):
            pad_name = f"{name}/pad_amounts"
            g.initializer.append(numpy_helper.from_array(
                np.array([0] * (nd + 2) + [0, 0] + extra, np.int64), pad_name))
            out_nodes.append(helper.make_node("Pad", [cur, pad_name], [f"{name}/padded"], name=f"{name}/pad"))
            cur = f"{name}/padded"
        starts = np.array(begin, np.int64)
        ends = np.array([-(e - o) if e > o else _INT_MAX for o, e in zip(op, end)], np.int64)
        axes = np.arange(2, 2 + nd, dtype=np.int64)
        for suffix, arr in (("starts", starts), ("ends", ends), ("axes", axes)):
            g.initializer.append(numpy_helper.from_array(arr, f"{name}/{suffix}"))
        sliced = f"{name}/trimmed" if move_bias else y
        out_nodes.append(helper.make_node("Slice", [cur, f"{name}/starts", f"{name}/ends", f"{name}/axes"],
                                          [sliced], name=f"{name}/trim"))
        if move_bias:
            b = numpy_helper.to_array(inits[node.input[2]])
            g.initializer.append(numpy_helper.from_array(b.reshape((-1,) + (1,) * nd), f"{name}/bias"))
            out_nodes.append(helper.make_node("Add", [sliced, f"{name}/bias"], [y], name=f"{name}/add_bias"))
        done.append(name)
    del g.node[:]
    g.node.extend(out_nodes)
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    unused = [t for t in g.initializer if t.name not in used]  # a moved bias's original
    for t in unused:
        g.initializer.remove(t)
    return done


def conv_transpose_graph(channels: int = 8, length: int = 40, kernel: int = 4, stride: int = 2,
                         pads: tuple[int, int] = (1, 1), output_padding: int = 1, group: int | None = None,
                         seed: int = 0):
    """A one-node graph ``x [1, C, T] -> y``: a 1-D ConvTranspose with seeded random weights and bias (``group``
    None: depthwise). The reproduction of the HTP's late output (defaults: the node seen late in a real vocoder)."""
    from onnx import TensorProto, helper, numpy_helper

    group = channels if group is None else group
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((channels, channels // group, kernel)) / np.sqrt(kernel)).astype(np.float32)
    b = (0.1 * rng.standard_normal(channels)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="tconv", strides=[stride],
                            pads=list(pads), output_padding=[output_padding], group=group, kernel_shape=[kernel])
    out = (length - 1) * stride + output_padding + kernel - pads[0] - pads[1]
    g = helper.make_graph([node], "conv_transpose", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [1, channels, length])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, out])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def rewrite_file(src: str | Path, dst: str | Path) -> list[str]:
    """:func:`rewrite_output_padding` of the graph at ``src`` written to ``dst`` (weights kept inline when they
    were); the rewritten node names."""
    import onnx

    model = onnx.load(str(src))
    done = rewrite_output_padding(model)
    onnx.save(model, str(dst))
    return done


__all__ = ["conv_transpose_graph", "needs_rewrite", "rewrite_file", "rewrite_output_padding"]
