"""The 12 Hz speech tokenizer as ONNX graphs: decoder (codes -> wav), streaming decoder, encoder.

The reference modules (``Qwen3TTSTokenizerV2Decoder``, the Mimi encoder) build
their attention masks with transformers' mask utilities and compute conv padding
from Python-level shapes, which the TorchScript exporter freezes to the example
length. The wrappers below re-express the same computation over the very same
weights, in plain tensor code whose shapes stay symbolic:

``DecoderStep`` (graph ``decoder_stream``)
    One chunk of frames with explicit state: every causal conv carries its last
    ``kernel - 1`` input samples, every causal ConvTranspose its last input
    sample, every transformer layer the post-RoPE keys/values of the last
    ``sliding_window - 1`` positions. ``position`` is the absolute index (inside
    the current decode segment) of the chunk's first frame: it feeds RoPE and the
    sliding-window mask. Feeding a sequence chunk by chunk gives the samples of
    one pass over the whole sequence (the decoder is causal end to end).
``FullDecoder`` (graph ``decoder``)
    ``DecoderStep`` from zero state at position 0: codes [1, F, 16] -> wav
    [1, F * 1920], equal to ``Qwen3TTSTokenizerV2Decoder.forward`` (clamp included).
    qwen-tts decodes through ``chunked_decode(chunk_size=300, left_context=25)``;
    the runtime reproduces that segmentation on the host (kztts.runners.codec).
``EncoderGraph`` (graph ``encoder``)
    wav [1, L] (24 kHz) -> codes [1, ceil(L / 1920), 16]: SEANet convs, the Mimi
    transformer (full causal attention, as ``create_causal_mask`` builds it), the
    stride-2 downsample, and the split RVQ (first ``encoder_valid_num_quantizers``
    codebooks), nearest codeword by the same augmented-matmul distance that
    ``torch.cdist`` uses, so ties and near-ties resolve like the reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kztts.export.common.onnx_export import export_onnx
from kztts.export.common.graph_parts import graph_spec

SAMPLES_PER_FRAME = 1920
# qwen-tts: Qwen3TTSTokenizerV2Decoder.chunked_decode defaults, used by Qwen3TTSTokenizerV2Model.decode
REFERENCE_CHUNK = 300
REFERENCE_LEFT_CONTEXT = 25


# ---------------------------------------------------------------- decoder
@dataclass(frozen=True)
class DecoderOptions:
    """How the decoder's convolutions and activations are written into the graph (same function).

    ``conv2d``: every Conv1d / ConvTranspose1d of the vocoder as its 2-D form over [1, C, 1, T]
    (ONNX Runtime's NCHWc layout transform and 2-D conv kernels only take 4-D convs).
    ``tconv_as_conv``: a ConvTranspose1d with kernel 2*stride (or == stride) as a Conv of kernel 2
    (or 1) with ``stride * C_out`` output channels, then a reshape/transpose that interleaves
    them in time (ORT's ConvTranspose runs a GEMM then a single-threaded col2im).
    ``fold_snake``: SnakeBeta's exp(alpha) and 1/(exp(beta)+eps) as initializers and sin^2 as
    one Mul instead of Pow.
    """

    conv2d: bool = False
    tconv_as_conv: bool = False
    fold_snake: bool = False

    @property
    def name(self) -> str:
        on = [f for f in ("conv2d", "tconv_as_conv", "fold_snake") if getattr(self, f)]
        return "+".join(on) or "plain"


PLAIN = DecoderOptions()
# What export_decoder writes for the CPU: benchmarks/decoder/bench_decoder.py on the 0.6B decoder, 1 thread,
# chunk 4: 7-10% less CPU per frame than PLAIN at >= 109 dB SNR against it. The HTP export
# (static_graphs.export_decoder_chunk) uses fold_snake (the HTP computes Pow inexactly in fp16) and tconv_as_conv (at
# 0.6B widths the HTP computed the w8a16 graph's ConvTranspose nodes wrongly), not conv2d.
DEFAULT_OPTIONS = DecoderOptions(conv2d=True, tconv_as_conv=True, fold_snake=True)


def _snake(act: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """SnakeBeta exactly as the reference: x + 1/(exp(beta)+1e-9) * sin(x * exp(alpha))^2."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    alpha = torch.exp(act.alpha).reshape(shape)
    beta = torch.exp(act.beta).reshape(shape)
    return x + (1.0 / (beta + act.no_div_by_zero)) * torch.pow(torch.sin(x * alpha), 2)


class _FoldedSnake(nn.Module):
    """SnakeBeta with its per-channel constants precomputed: x + inv_beta * s * s, s = sin(x * alpha)."""

    def __init__(self, act: nn.Module):
        super().__init__()
        with torch.no_grad():
            self.register_buffer("alpha", torch.exp(act.alpha).detach().clone())
            inv = 1.0 / (torch.exp(act.beta) + act.no_div_by_zero)
            self.register_buffer("inv_beta", inv.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)
        s = torch.sin(x * self.alpha.reshape(shape))
        return x + self.inv_beta.reshape(shape) * (s * s)


class DecoderStep(nn.Module):
    """forward(codes [1,C,16] int64, position [1] int64, *state) -> (wav [1, C*1920], *new_state)."""

    def __init__(self, decoder: nn.Module, options: DecoderOptions = PLAIN):
        super().__init__()
        cfg = decoder.config
        self.dec = decoder
        self.options = options
        q = decoder.quantizer
        layers = list(q.rvq_first.vq.layers) + list(q.rvq_rest.vq.layers)
        for layer in layers:
            if not isinstance(layer.project_out, nn.Identity):
                raise NotImplementedError("decoder RVQ with project_out is not supported")
        with torch.no_grad():
            books = [l._codebook.embedding_sum / l._codebook.cluster_usage.clamp(min=l._codebook.epsilon)[:, None]
                     for l in layers]
        self.register_buffer("codebooks", torch.stack(books).detach().clone(), persistent=False)
        self.num_quantizers = len(layers)
        self.bins = books[0].shape[0]
        self.n_semantic = q.n_q_semantic
        if self.n_semantic != 1:
            raise NotImplementedError("decoder with more than one semantic quantizer")
        tr = decoder.pre_transformer
        self.window = int(cfg.sliding_window)
        self.kv_len = self.window - 1
        self.head_dim = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.rope_scaling = float(tr.rotary_emb.attention_scaling)
        self.register_buffer("inv_freq", tr.rotary_emb.inv_freq.detach().float().clone(), persistent=False)
        self.samples_per_frame = int(decoder.total_upsample)
        self.state_specs = self._state_specs()
        self._prepared: dict[tuple, tuple[str, str | None]] = {}  # (id(conv), form) -> buffer names
        self._snakes = nn.ModuleDict()
        if options.fold_snake:
            for name, mod in decoder.decoder.named_modules():
                if type(mod).__name__ == "SnakeBeta":
                    self._snakes[name.replace(".", "_")] = _FoldedSnake(mod)
            self._snake_key = {id(mod): name.replace(".", "_") for name, mod in decoder.decoder.named_modules()
                               if type(mod).__name__ == "SnakeBeta"}
        self._prepare()

    def _prepare(self) -> None:
        """Make every rewritten weight now, so the exporter sees module buffers (initializers)."""
        opt = self.options
        for tconv, _ in self.dec.upsample:  # these stay 1-D
            c = tconv.conv
            if opt.tconv_as_conv and c.kernel_size[0] in (c.stride[0], 2 * c.stride[0]):
                self._buffer(c, self._tconv_weights, "1d")
        for mod in self.dec.decoder.modules():
            as_conv = isinstance(mod, nn.ConvTranspose1d) and opt.tconv_as_conv \
                and mod.kernel_size[0] in (mod.stride[0], 2 * mod.stride[0])
            if as_conv:
                self._buffer(mod, self._tconv_2d if opt.conv2d else self._tconv_weights, "2d" if opt.conv2d else "1d")
            elif isinstance(mod, (nn.Conv1d, nn.ConvTranspose1d)) and opt.conv2d:
                self._buffer(mod, self._as_2d, "2d")

    # ---- state layout (names and shapes, batch 1), in graph input order
    def _conv_ctx(self, cc) -> int:
        conv = cc.conv
        if conv.stride[0] != 1 or cc.padding != cc.kernel_size - 1:
            raise NotImplementedError("decoder conv with stride != 1")
        return cc.kernel_size - 1

    @staticmethod
    def _tconv_ctx(tc) -> int:
        k, s = tc.conv.kernel_size[0], tc.conv.stride[0]
        if tc.left_pad != 0 or tc.right_pad != k - s:
            raise NotImplementedError("decoder ConvTranspose with unexpected trim")
        return math.ceil(k / s) - 1

    def _state_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        d = self.dec
        specs = [("pre_conv", (1, d.pre_conv.conv.in_channels, self._conv_ctx(d.pre_conv)))]
        for i in range(len(d.pre_transformer.layers)):
            shape = (1, self.num_kv_heads, self.kv_len, self.head_dim)
            specs += [(f"key_{i}", shape), (f"value_{i}", shape)]
        for i, (tconv, block) in enumerate(d.upsample):
            if self._tconv_ctx(tconv):
                raise NotImplementedError("overlapping upsample ConvTranspose")
            specs.append((f"up{i}_dwconv", (1, block.dwconv.conv.in_channels, self._conv_ctx(block.dwconv))))
        first = d.decoder[0]
        specs.append(("dec_in", (1, first.conv.in_channels, self._conv_ctx(first))))
        for b, blk in enumerate(d.decoder[1:-2]):
            tconv = blk.block[1]
            specs.append((f"block{b}_tconv", (1, tconv.conv.in_channels, self._tconv_ctx(tconv))))
            for r, unit in enumerate(blk.block[2:]):
                specs.append((f"block{b}_res{r}", (1, unit.conv1.conv.in_channels, self._conv_ctx(unit.conv1))))
        last = d.decoder[-1]
        specs.append(("dec_out", (1, last.conv.in_channels, self._conv_ctx(last))))
        return specs

    def zero_state(self) -> list[torch.Tensor]:
        return [torch.zeros(shape) for _, shape in self.state_specs]

    # ---- building blocks
    def _buffer(self, conv: nn.Module, make, form: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) of ``conv`` rewritten by ``make`` into ``form``, made once and kept as buffers,
        so the graph gets them as initializers (quantizers and ORT's prepacking want that)."""
        key = (id(conv), form)
        if key not in self._prepared:
            with torch.no_grad():
                w, b = make(conv)
            n = len(self._prepared)
            self.register_buffer(f"_w{n}", w.detach().contiguous())  # persistent: an initializer, not a Constant
            if b is not None:
                self.register_buffer(f"_b{n}", b.detach().contiguous())
            self._prepared[key] = (f"_w{n}", f"_b{n}" if b is not None else None)
        wn, bn = self._prepared[key]
        return getattr(self, wn), (getattr(self, bn) if bn else None)

    @staticmethod
    def _as_2d(conv: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        return conv.weight[:, :, None, :], conv.bias

    def _tconv_2d(self, conv: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        w, b = self._tconv_weights(conv)
        return w[:, :, None, :], b

    def _conv(self, conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
        """``conv`` (stride 1, no padding) on [1, C, T] or, as its 2-D form, on [1, C, 1, T]."""
        if x.dim() == 3:
            return F.conv1d(x, conv.weight, conv.bias, dilation=conv.dilation[0], groups=conv.groups)
        w, b = self._buffer(conv, self._as_2d, "2d")
        return F.conv2d(x, w, b, dilation=(1, conv.dilation[0]), groups=conv.groups)

    def _causal_conv(self, cc, x, state, new):
        if x.dim() == 4:
            xx = torch.cat([state[:, :, None, :], x], dim=-1)
            new.append(xx[:, :, 0, -state.shape[-1]:])
        else:
            xx = torch.cat([state, x], dim=-1)
            new.append(xx[..., -state.shape[-1]:])
        return self._conv(cc.conv, xx)

    def _snake(self, act: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.options.fold_snake:
            return self._snakes[self._snake_key[id(act)]](x)
        return _snake(act, x)

    def _tconv(self, tc, x, state, new):
        conv = tc.conv
        s, k = conv.stride[0], conv.kernel_size[0]
        ctx = state.shape[-1]
        if ctx:
            if x.dim() == 4:
                xx = torch.cat([state[:, :, None, :], x], dim=-1)
                new.append(xx[:, :, 0, -ctx:])
            else:
                xx = torch.cat([state, x], dim=-1)
                new.append(xx[..., -ctx:])
        else:
            xx = x
        if self.options.tconv_as_conv and k in (s, 2 * s):
            return self._tconv_as_conv(conv, xx)
        if xx.dim() == 4:
            w, b = self._buffer(conv, self._as_2d, "2d")
            y = F.conv_transpose2d(xx, w, b, stride=(1, s))
        else:
            y = F.conv_transpose1d(xx, conv.weight, conv.bias, stride=s)
        if ctx == 0:  # kernel == stride: no overlap, no trim
            return y
        # y covers (ctx + C - 1) * s + k samples: the chunk's own C * s start after ctx * s
        # and end k - s before the end (the reference trims k - s on the right)
        return y[..., ctx * s: y.shape[-1] - (k - s)]

    @staticmethod
    def _tconv_weights(conv: nn.ConvTranspose1d) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ConvTranspose1d(k = s or 2s) -> Conv weights [C_out * s, C_in, k / s]: output channel
        co * s + j is output sample t * s + j of channel co; tap 0 reads input t - 1, the last tap t."""
        w, s = conv.weight, conv.stride[0]  # [C_in, C_out, k]
        taps = [w[:, :, s:], w[:, :, :s]] if w.shape[-1] == 2 * s else [w]
        wc = torch.stack(taps, dim=-1)  # [C_in, C_out, s, taps]
        wc = wc.permute(1, 2, 0, 3).reshape(w.shape[1] * s, w.shape[0], len(taps))
        bias = conv.bias.repeat_interleave(s) if conv.bias is not None else None
        return wc, bias

    def _tconv_as_conv(self, conv: nn.ConvTranspose1d, xx: torch.Tensor) -> torch.Tensor:
        """ConvTranspose (stride s, kernel s or 2s, one input of context already in ``xx``) as a Conv
        giving s samples per input position in its channels, then interleaved in time."""
        s, c_out = conv.stride[0], conv.out_channels
        if xx.dim() == 4:
            w, b = self._buffer(conv, self._tconv_2d, "2d")
            y = F.conv2d(xx, w, b)  # [1, C_out * s, 1, T]
            t = y.shape[-1]
            return y.reshape(1, c_out, s, t).transpose(2, 3).reshape(1, c_out, 1, t * s)
        w, b = self._buffer(conv, self._tconv_weights, "1d")
        y = F.conv1d(xx, w, b)
        t = y.shape[-1]
        return y.reshape(1, c_out, s, t).transpose(2, 3).reshape(1, c_out, t * s)

    def _attention(self, attn, x, cos, sin, past_k, past_v, allowed, new):
        b, t, _ = x.shape
        hd = self.head_dim
        q = attn.q_proj(x).view(b, t, self.num_heads, hd).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        half = hd // 2
        q = q * c + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * s
        k = k * c + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * s
        keys = torch.cat([past_k, k], dim=2)
        values = torch.cat([past_v, v], dim=2)
        new.append(keys[:, :, -self.kv_len:])
        new.append(values[:, :, -self.kv_len:])
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, keys.transpose(2, 3)) * attn.scaling
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, values).transpose(1, 2).reshape(b, t, self.num_heads * hd)
        return attn.o_proj(out)

    def _transformer(self, x, position, states, new):
        tr = self.dec.pre_transformer
        t = x.shape[1]
        x = tr.input_proj(x)
        pos = position + torch.arange(t, dtype=torch.int64)  # [t] absolute positions
        freqs = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        cos, sin = emb.cos() * self.rope_scaling, emb.sin() * self.rope_scaling
        # keys: kv_len state slots (absolute position - kv_len + j) then the chunk
        kpos = position - self.kv_len + torch.arange(self.kv_len + t, dtype=torch.int64)
        qp, kp = pos[:, None], kpos[None, :]
        allowed = (kp >= 0) & (kp <= qp) & (kp > qp - self.window)
        for i, layer in enumerate(tr.layers):
            h = layer.input_layernorm(x)
            h = self._attention(layer.self_attn, h, cos, sin, states[2 * i], states[2 * i + 1], allowed, new)
            x = x + layer.self_attn_layer_scale(h)
            h = layer.mlp(layer.post_attention_layernorm(x))
            x = x + layer.mlp_layer_scale(h)
        return tr.output_proj(tr.norm(x))

    def forward(self, codes, position, *state):
        d = self.dec
        q = d.quantizer
        it = iter(state)
        new: list[torch.Tensor] = []
        offsets = torch.arange(self.num_quantizers, dtype=torch.int64) * self.bins
        flat = self.codebooks.reshape(-1, self.codebooks.shape[-1])
        emb = F.embedding(codes + offsets, flat)  # [1, C, 16, D]
        first = emb[:, :, 0].transpose(1, 2)
        rest = emb[:, :, 1:].sum(dim=2).transpose(1, 2)
        hidden = q.rvq_first.output_proj(first) + q.rvq_rest.output_proj(rest)
        hidden = self._causal_conv(d.pre_conv, hidden, next(it), new)
        kv = [next(it) for _ in range(2 * len(d.pre_transformer.layers))]
        hidden = self._transformer(hidden.transpose(1, 2), position, kv, new).permute(0, 2, 1)
        for tconv, block in d.upsample:
            hidden = self._tconv(tconv, hidden, hidden.new_zeros(1, 1, 0), new)
            x = self._causal_conv(block.dwconv, hidden, next(it), new)
            x = block.norm(x.permute(0, 2, 1))
            x = block.pwconv2(block.act(block.pwconv1(x)))
            hidden = hidden + (block.gamma * x).permute(0, 2, 1)
        if self.options.conv2d:  # the vocoder on [1, C, 1, T]
            hidden = hidden[:, :, None, :]
        wav = self._causal_conv(d.decoder[0], hidden, next(it), new)
        for blk in d.decoder[1:-2]:
            wav = self._snake(blk.block[0], wav)
            wav = self._tconv(blk.block[1], wav, next(it), new)
            for unit in blk.block[2:]:
                x = self._causal_conv(unit.conv1, self._snake(unit.act1, wav), next(it), new)
                x = self._conv(unit.conv2.conv, self._snake(unit.act2, x))
                wav = wav + x
        wav = self._snake(d.decoder[-2], wav)
        wav = self._causal_conv(d.decoder[-1], wav, next(it), new)
        wav = wav.clamp(min=-1, max=1)
        if wav.dim() == 4:
            wav = wav[:, :, 0]
        return (wav[:, 0], *new)


class FullDecoder(nn.Module):
    """codes [1, F, 16] -> wav [1, F * 1920]: one pass from zero state (== decoder.forward)."""

    def __init__(self, step: DecoderStep):
        super().__init__()
        self.step = step

    def forward(self, codes):
        out = self.step(codes, torch.zeros(1, dtype=torch.int64), *self.step.zero_state())
        return out[0]


def _decoder_of(model) -> nn.Module:
    """The Qwen3TTSTokenizerV2Decoder of a Qwen3TTSForConditionalGeneration (or of the tokenizer)."""
    st = getattr(model, "speech_tokenizer", model)
    st = getattr(st, "model", st)  # Qwen3TTSTokenizer wrapper -> Qwen3TTSTokenizerV2Model
    return st


def _static_outputs(path: Path, shapes: dict) -> None:
    """Declare the (fixed) shapes of state outputs, which ONNX shape inference leaves symbolic."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for out in model.graph.output:
        if out.name in shapes:
            dims = out.type.tensor_type.shape.dim
            for d, v in zip(dims, shapes[out.name]):
                d.Clear()
                d.dim_value = int(v)
    onnx.save(model, str(path))


def _example_codes(frames: int, bins: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, bins, (1, frames, 16), generator=g, dtype=torch.int64)


def export_stream_graph(step: DecoderStep, path: Path) -> Path:
    """The ``decoder_stream`` graph of ``step`` at ``path`` (inputs codes, position, state_*)."""
    names = [n for n, _ in step.state_specs]
    ins = ["codes", "position"] + [f"state_{n}" for n in names]
    outs = ["wav"] + [f"new_state_{n}" for n in names]
    example = (_example_codes(5, step.bins), torch.tensor([3], dtype=torch.int64), *step.zero_state())
    export_onnx(step, example, path, ins, outs, {"codes": {1: "frames"}, "wav": {1: "samples"}})
    _static_outputs(path, {f"new_state_{n}": s for n, s in step.state_specs})
    return path


def export_decoder(model, bundle_dir: Path, export_id: str, options: DecoderOptions = DEFAULT_OPTIONS) -> dict:
    """Export graphs ``decoder`` (full) and ``decoder_stream`` (stateful chunk) into ``bundle_dir/graphs``."""
    bundle_dir = Path(bundle_dir)
    st = _decoder_of(model)
    step = DecoderStep(st.decoder, options).eval()
    if step.samples_per_frame != SAMPLES_PER_FRAME:
        raise NotImplementedError(f"decoder upsamples by {step.samples_per_frame}, expected {SAMPLES_PER_FRAME}")
    codec_info = {
        "samples_per_frame": step.samples_per_frame, "sample_rate": int(st.get_output_sample_rate()),
        "num_quantizers": step.num_quantizers, "codebook_size": step.bins,
        "sliding_window": step.window, "reference_chunk": REFERENCE_CHUNK,
        "reference_left_context": REFERENCE_LEFT_CONTEXT, "decoder_options": options.name,
    }
    codes = _example_codes(5, step.bins)

    rel = "graphs/decoder.onnx"
    export_onnx(FullDecoder(step).eval(), (codes,), bundle_dir / rel, ["codes"], ["wav"],
                {"codes": {1: "frames"}, "wav": {1: "samples"}})
    full = graph_spec(bundle_dir, "decoder", rel, "dynamic", "fp32", export_id)
    full.extra.update(codec_info)

    rel = "graphs/decoder_stream.onnx"
    export_stream_graph(step, bundle_dir / rel)
    stream = graph_spec(bundle_dir, "decoder_stream", rel, "dynamic", "fp32", export_id)
    stream.extra.update(codec_info)
    stream.extra["state"] = [{"name": n, "shape": list(s)} for n, s in step.state_specs]
    return {"decoder": full, "decoder_stream": stream}


# ---------------------------------------------------------------- encoder
def _mimi_conv(layer, x):
    """MimiConv1d (causal) with the reference's padding, in static-shape form.

    The reference pads ``kernel - stride`` on the left and ``(-L) mod stride`` on the
    right. Padding ``stride - 1`` on the right instead yields the same output
    frames (ceil(L / stride)): the extra samples are never read.
    """
    if not layer.causal:
        raise NotImplementedError("non-causal Mimi conv")
    k, s = int(layer.kernel_size), int(layer.stride)
    mode = {"constant": "constant", "replicate": "replicate"}.get(layer.pad_mode)
    if mode is None:
        raise NotImplementedError(f"Mimi conv pad_mode {layer.pad_mode!r}")
    x = F.pad(x, (k - s, s - 1), mode=mode)
    return layer.conv(x)


class EncoderGraph(nn.Module):
    """wav [1, L] at 24 kHz -> codes [1, ceil(L/1920), n_valid] int64."""

    def __init__(self, st_model: nn.Module):
        super().__init__()
        enc = st_model.encoder
        self.enc = enc
        self.n_valid = int(st_model.encoder_valid_num_quantizers)
        cfg = enc.config
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = enc.quantizer
        sem, aco = q.semantic_residual_vector_quantizer, q.acoustic_residual_vector_quantizer
        if q.num_semantic_quantizers != 1:
            raise NotImplementedError("encoder with more than one semantic quantizer")
        n_ac = self.n_valid - 1
        if n_ac > len(aco.layers):
            raise ValueError(f"encoder has {1 + len(aco.layers)} quantizers, fewer than {self.n_valid}")
        self.sem, self.aco, self.n_ac = sem, aco, n_ac
        # augmented codebooks [D + 2, bins] for  |x|^2 - 2 x.e + |e|^2  as torch.cdist computes it
        books = []
        with torch.no_grad():
            for layer in list(sem.layers) + list(aco.layers[:n_ac]):
                cb = layer.codebook
                embed = cb.embed_sum / cb.cluster_usage.clamp(min=cb.epsilon)[:, None]
                books.append(embed.float())
        aug = [torch.cat([e, torch.ones_like(e[:, :1]), e.pow(2).sum(-1, keepdim=True)], dim=-1).t() for e in books]
        # one initializer per codebook, shared by the distance MatMul and the codeword Gather
        self.aug = nn.ParameterList([nn.Parameter(a.contiguous(), requires_grad=False) for a in aug])  # [D+2, bins]
        rot = enc.encoder_transformer.layers[0].self_attn.rotary_emb
        self.register_buffer("inv_freq", rot.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scaling = float(rot.attention_scaling)

    def _transformer(self, x):
        tr = self.enc.encoder_transformer
        b, t, _ = x.shape
        pos = torch.arange(t, dtype=torch.int64)
        freqs = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        cos, sin = (emb.cos() * self.rope_scaling).unsqueeze(1), (emb.sin() * self.rope_scaling).unsqueeze(1)
        allowed = pos[None, :] <= pos[:, None]  # full causal (create_causal_mask ignores sliding_window)
        hd, half = self.head_dim, self.head_dim // 2
        groups = self.num_heads // self.num_kv_heads
        for layer in tr.layers:
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, t, self.num_heads, hd).transpose(1, 2)
            k = attn.k_proj(h).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
            v = attn.v_proj(h).view(b, t, self.num_kv_heads, hd).transpose(1, 2)
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            if groups > 1:
                k = k.repeat_interleave(groups, dim=1)
                v = v.repeat_interleave(groups, dim=1)
            scores = torch.matmul(q, k.transpose(2, 3)) * attn.scaling
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, t, -1)
            x = x + layer.self_attn_layer_scale(attn.o_proj(out))
            x = x + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(x)))
        return x

    def _rvq(self, x, first: int, count: int):
        """Residual quantization of x [1, D, T] with codebooks first..first+count-1 -> [count] of [1, T]."""
        codes = []
        residual = x
        for i in range(first, first + count):
            r = residual[0].transpose(0, 1)  # [T, D]
            norm = r.pow(2).sum(-1, keepdim=True)
            lhs = torch.cat([r * -2.0, norm, torch.ones_like(norm)], dim=-1)  # [T, D+2]
            dist = torch.sqrt(torch.clamp(torch.matmul(lhs, self.aug[i]), min=0.0))
            idx = torch.argmin(dist, dim=-1)  # first minimum, as torch.cdist(...).argmin
            codes.append(idx[None])
            # the chosen codewords are columns of the augmented table's first D rows
            picked = torch.index_select(self.aug[i], 1, idx)[: r.shape[1]]  # [D, T]
            residual = residual - picked[None]
        return codes

    def forward(self, wav):
        enc = self.enc
        x = wav[:, None, :]
        for layer in enc.encoder.layers:
            name = type(layer).__name__
            if name == "MimiConv1d":
                x = _mimi_conv(layer, x)
            elif name == "MimiResnetBlock":
                h = x
                for sub in layer.block:
                    h = _mimi_conv(sub, h) if type(sub).__name__ == "MimiConv1d" else sub(h)
                if type(layer.shortcut).__name__ == "MimiConv1d":
                    x = _mimi_conv(layer.shortcut, x) + h
                else:
                    x = layer.shortcut(x) + h
            else:
                x = layer(x)
        x = self._transformer(x.transpose(1, 2)).transpose(1, 2)
        x = _mimi_conv(enc.downsample, x)
        sem_in = self.sem.input_proj(x) if self.sem.input_proj is not None else x
        aco_in = self.aco.input_proj(x) if self.aco.input_proj is not None else x
        codes = self._rvq(sem_in, 0, 1) + self._rvq(aco_in, 1, self.n_ac)
        return torch.stack(codes, dim=-1)  # [1, T, n_valid]


def export_encoder(model, bundle_dir: Path, export_id: str) -> dict:
    """Export graph ``encoder`` (wav [1, L] f32 24 kHz -> codes [1, F, 16] int64)."""
    bundle_dir = Path(bundle_dir)
    st = _decoder_of(model)
    graph = EncoderGraph(st).eval()
    example = (torch.randn(1, 3 * SAMPLES_PER_FRAME + 123, generator=torch.Generator().manual_seed(0)) * 0.1,)
    rel = "graphs/encoder.onnx"
    export_onnx(graph, example, bundle_dir / rel, ["wav"], ["codes"],
                {"wav": {1: "samples"}, "codes": {1: "frames"}})
    spec = graph_spec(bundle_dir, "encoder", rel, "dynamic", "fp32", export_id)
    spec.extra.update({"sample_rate": int(st.get_input_sample_rate()),
                       "samples_per_frame": int(st.get_encode_downsample_rate()),
                       "num_quantizers": graph.n_valid})
    return {"encoder": spec}
