"""The cost-on-paper model (kztts.htp.cost) against Qualcomm AI Hub's measured times for a conv decoder
(README.md, "Paper against measured").

    python benchmarks/piper_decoder/paper_vs_aihub.py [--piper-decoder DECODER.onnx]

Builds the MeloTTS English HiFi-GAN decoder's shapes as an ONNX graph (random weights: the paper counts bytes and
MACs, which do not depend on the values) and puts it through kztts.htp.cost's rule, max(bytes / bandwidth,
MACs / (int8 TOPS / 2)), for each target that has the figures; then divides AI Hub's published time by it.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from kztts.htp.cost import CONV_DECODER_RATES, MELO_DECODER_MACS, profile_graph
from kztts.htp.targets import load_target

# MeloTTS EN (VITS / Bert-VITS2 44.1 kHz generator): hop 512 = 8*8*2*2*2 (AI Hub's melotts upsample_factor 512),
# latent z [1, 192, 64] and speaker g [1, 256, 1] (AI Hub's Decoder input spec), HiFi-GAN V1 residual blocks.
MELO = dict(in_ch=192, frames=64, initial=512, rates=(8, 8, 2, 2, 2), kernels=(16, 16, 8, 2, 2),
            res_kernels=(3, 7, 11), dilations=(1, 3, 5), gin=256)
# AI Hub's measured times (both runtimes) per SoC: kztts.htp.cost.CONV_DECODER_RATES, whose source it names
TARGETS = ("x_elite", "x2_elite", "sm8650", "sm8750")


def hifigan_graph(path: Path, cfg: dict) -> Path:
    """A HiFi-GAN V1 generator's layers (conv_pre, speaker cond, upsamplings, residual blocks, conv_post, tanh)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    n = [0]

    def w(shape):
        name = f"w{len(inits)}"
        inits.append(numpy_helper.from_array(rng.normal(0, 0.02, shape).astype(np.float32), name))
        return name

    def conv(x, cin, cout, k, dil=1, op="Conv", stride=1):
        n[0] += 1
        y = f"t{n[0]}"
        if op == "Conv":
            pad = dil * (k - 1) // 2
            nodes.append(helper.make_node("Conv", [x, w((cout, cin, k)), w((cout,))], [y], dilations=[dil],
                                          pads=[pad, pad]))
        else:
            pad = (k - stride) // 2
            nodes.append(helper.make_node("ConvTranspose", [x, w((cin, cout, k)), w((cout,))], [y],
                                          strides=[stride], pads=[pad, pad]))
        return y

    def act(x):
        n[0] += 1
        nodes.append(helper.make_node("LeakyRelu", [x], [f"t{n[0]}"], alpha=0.1))
        return f"t{n[0]}"

    def add(a, b):
        n[0] += 1
        nodes.append(helper.make_node("Add", [a, b], [f"t{n[0]}"]))
        return f"t{n[0]}"

    x = conv("z", cfg["in_ch"], cfg["initial"], 7)
    x = add(x, conv("g", cfg["gin"], cfg["initial"], 1))
    ch = cfg["initial"]
    for rate, k in zip(cfg["rates"], cfg["kernels"]):
        x = conv(act(x), ch, ch // 2, k, op="ConvTranspose", stride=rate)
        ch //= 2
        outs = []
        for rk in cfg["res_kernels"]:
            h = x
            for d in cfg["dilations"]:
                h = add(h, conv(act(conv(act(h), ch, ch, rk, d)), ch, ch, rk, 1))
            outs.append(h)
        x = outs[0]
        for o in outs[1:]:
            x = add(x, o)
    y = conv(act(x), ch, 1, 7)
    nodes.append(helper.make_node("Tanh", [y], ["audio"]))
    g = helper.make_graph(nodes, "hifigan",
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, cfg["in_ch"], cfg["frames"]]),
                           helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, cfg["gin"], 1])],
                          [helper.make_tensor_value_info("audio", TensorProto.FLOAT, None)], inits)
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def paper_ms(macs: int, weight_params: int, io_bytes: int, weight_bytes_per_param: float, target) -> dict:
    """kztts.htp.cost's rule for one call on ``target``'s HTP: max(bytes / bandwidth, MACs / (TOPS / 2))."""
    cost = target.cost or {}
    bw = cost.get("effective_gbps") or cost.get("dram_gbps")
    tops = cost.get("htp_int8_tops")
    bytes_ms = (weight_params * weight_bytes_per_param + io_bytes) / (bw * 1e9) * 1e3 if bw else None
    compute_ms = macs / (tops * 1e12 / 2) * 1e3 if tops else None
    return {"bytes_ms": bytes_ms, "compute_ms": compute_ms,
            "ms": max(v for v in (bytes_ms, compute_ms) if v is not None) if bw or tops else None}


def graph_counts(path: Path) -> tuple[int, int, int]:
    """(MACs, weight parameters, input + output bytes) of one call of ``path`` (static shapes)."""
    import onnx

    macs, ins, outs, _, _ = profile_graph(path, {})
    params = sum(int(np.prod(t.dims)) for t in onnx.load(str(path)).graph.initializer)
    return sum(macs.values()), params, sum(b for b, _ in ins.values()) + sum(b for b, _ in outs.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        macs, params, io = graph_counts(hifigan_graph(Path(tmp) / "melo_decoder.onnx", MELO))
    print(f"MeloTTS EN decoder shapes: z [1, 192, {MELO['frames']}] -> {MELO['frames'] * 512} samples, "
          f"{macs / 1e9:.2f} GMAC, {params / 1e6:.2f} M weights")
    assert macs == MELO_DECODER_MACS, "kztts.htp.cost's conv rates rest on these MACs"
    print("| target | AI Hub device | AI Hub ms (w8a16, two runtimes) | paper bytes ms | paper compute ms | paper ms | "
          "measured / paper | conv rate GMAC/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in TARGETS:
        target = load_target(name)
        rate = CONV_DECODER_RATES[target.soc.name]
        ms = sum(rate.ms) / len(rate.ms)
        p = paper_ms(macs, params, io, 1.0, target)  # w8: one byte per weight
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        ratio = "-" if p["ms"] is None else f"{ms / p['ms']:.1f}x"
        print(f"| {name} | {rate.device} | {rate.ms[0]}, {rate.ms[1]} | {fmt(p['bytes_ms'])} | "
              f"{fmt(p['compute_ms'])} | "
              f"{fmt(p['ms'])} | {ratio} | {rate.macs_per_s / 1e9:.0f} +-{rate.spread:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
