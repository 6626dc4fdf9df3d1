"""The graph registry: every graph kind a bundle can hold, its role, its I/O names and its
variants, and the precision lists. Export writes graphs under these names; the runtime, the
CLI and the bench read them from here (never from literals). The manifest stays the contract
on disk: ``require`` checks a bundle has what a feature needs before any work starts.
"""
from __future__ import annotations

from dataclasses import dataclass

from kztts.bundle import precisions as P
from kztts.core import env
from kztts.core.errors import BundleError

# ------------------------------------------------------------------ precisions
CPU_WEIGHT_PRECISIONS = ("fp32", "int8", "int4")  # MatMul weights of the CPU graphs (variants)
KV_PRECISIONS = ("fp32", "fp16")  # the host KV cache of the CPU graphs
# the speech decoder: fp32; int8 = its MatMuls as 8-bit MatMulNBits (convolutions fp32); int8-static = every Conv
# and MatMul in static int8 QDQ (per-channel weights, calibrated activations: kztts.export.common.decoder_qdq);
# fp16 = its weights stored in fp16, computed in fp32 (kztts.export.common.variants.fp16_weights)
DECODER_PRECISIONS = ("fp32", "int8", "int8-static", "fp16")


# One table of precisions for every route (kztts.bundle.precisions); the HTP precisions of a bundle's static
# graphs are its ``bundle`` entries.
HtpPrecision = P.Precision
HTP_PRECISION_ENTRIES: dict[str, HtpPrecision] = {n: P.PRECISIONS[n] for n in P.BUNDLE_PRECISIONS}
HTP_PRECISIONS = tuple(HTP_PRECISION_ENTRIES)  # most precise first
FLOAT_HTP_PRECISION = next(n for n, p in HTP_PRECISION_ENTRIES.items() if not p.quantized)  # float graphs' (fp16)
QUANTIZED_PRECISIONS = tuple(n for n, p in HTP_PRECISION_ENTRIES.items() if p.quantized)
HTP_KV_DTYPES = {n: p.kv_dtypes for n, p in HTP_PRECISION_ENTRIES.items()}
HTP_PRECISION_HELP = {n: p.help for n, p in HTP_PRECISION_ENTRIES.items()}
# The speech decoder's static graph on the HTP (``decoder_chunk``): fp16 by default, or a quantized precision chosen
# with ``kztts export --target T --decoder P`` (the recipe the real-vocoder study kept: benchmarks/piper_decoder).
HTP_DECODER_PRECISIONS = tuple(n for n, p in HTP_PRECISION_ENTRIES.items() if p.decoder_bounds)
HTP_DECODER_FLAGS = tuple(n for n in HTP_DECODER_PRECISIONS if HTP_PRECISION_ENTRIES[n].quantized)
# A unit of a precision plan (kztts.htp.placement) on the CPU: the fp32 graphs.
CPU_PRECISION = "fp32"
KV_NUMPY = {"fp32": "float32", "fp16": "float16", "uint8": "uint8"}  # numpy names of the KV dtypes
KV_UINT8_ZERO_POINT = 128  # symmetric 8-bit KV: value = (q - 128) * scale
ATTENTIONS = env.ATTENTIONS  # CPU attention: ORT GroupQueryAttention graphs, or plain ONNX ops
CP_MODES = ("frame", "step")  # Code Predictor: one graph per frame, or one run per codebook
DEVICES = ("cpu", "htp")

# The speech decoder's segmentation (qwen-tts ``chunked_decode``): segments of 300 frames, each after
# 25 frames of left context; a static decoder chunk must not straddle a boundary.
DECODER_SEGMENT = 300
DECODER_LEFT_CONTEXT = 25

# A plot colour per weight precision (bench Pareto plot), so a new precision is one entry here.
PRECISION_COLOURS = {"fp32": "tab:blue", "int8": "tab:orange", "int4": "tab:green",
                     **{n: p.colour for n, p in HTP_PRECISION_ENTRIES.items()}}


def htp_precision(name: str) -> HtpPrecision:
    """The registry entry of HTP precision ``name`` (a bundle's; ``kztts.bundle.precisions.precision`` for any);
    ValueError naming the known ones."""
    try:
        return HTP_PRECISION_ENTRIES[name]
    except KeyError:
        raise ValueError(f"unknown HTP precision {name!r} (known: {', '.join(HTP_PRECISIONS)})") from None


def least_precise(names) -> str:
    """Of HTP precision ``names``, the one that loses most (the last in ``HTP_PRECISIONS``); the bounds of a
    mixed plan are its least precise member's."""
    names = [n for n in names if n in HTP_PRECISION_ENTRIES]
    if not names:
        raise ValueError("no HTP precision given")
    return max(names, key=HTP_PRECISIONS.index)


def most_precise_quantized() -> str:
    """The quantized precision that loses least (a plan's CPU or fp16 layer inside a whole-stack QDQ graph)."""
    return QUANTIZED_PRECISIONS[0]


# ------------------------------------------------------------------ KV naming schemes
@dataclass(frozen=True)
class KVNames:
    """How a graph names its per-layer KV inputs and outputs (``kind`` is ``key`` or ``value``)."""

    past: str
    new: str

    def past_name(self, kind: str, layer: int | None = None) -> str:
        return self.past.format(kind=kind, layer=layer)

    def new_name(self, kind: str, layer: int | None = None) -> str:
        return self.new.format(kind=kind, layer=layer)

    def past_names(self, num_layers: int) -> list[str]:
        """``past_key_0, past_value_0, past_key_1, ...`` (layer-major, key before value)."""
        return [self.past_name(k, i) for i in range(num_layers) for k in ("key", "value")]

    def new_names(self, num_layers: int) -> list[str]:
        return [self.new_name(k, i) for i in range(num_layers) for k in ("key", "value")]


DYNAMIC_KV = KVNames("past_{kind}_{layer}", "new_{kind}_{layer}")  # CPU graphs: only the new entries out
FUSED_KV = KVNames("past_{kind}_{layer}", "present_{kind}_{layer}")  # GroupQueryAttention: bound in place
STATIC_KV = KVNames("past_{kind}_{layer}_in", "new_{kind}_{layer}")  # HTP Talker: keys transposed
SEGMENT_KV = KVNames("past_{kind}_in", "new_{kind}")  # one Talker layer per graph


# ------------------------------------------------------------------ graph kinds
@dataclass(frozen=True)
class GraphKind:
    """One graph of a bundle. ``role``: the job it does (several graphs may serve one role);
    ``variant``: ``dynamic`` (symbolic shapes, CPU only) or ``static`` (fixed shapes, CPU or
    HTP); ``placement_key``: the target file's ``placement`` key that puts it on the HTP;
    ``inputs``: the named non-KV inputs the runtime feeds; ``kv``: its KV naming scheme."""

    name: str
    role: str
    variant: str
    description: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    kv: KVNames | None = None
    placement_key: str | None = None
    fused: bool = False  # an ORT fused-attention graph (CPU only, preferred when present)
    exported_by: str = "kztts export MODEL_DIR -o BUNDLE"

    @property
    def htp(self) -> bool:
        return self.variant == "static"


_SAMPLER = ("temperature", "top_k", "top_p", "repetition_penalty", "uniforms")
_TARGET_EXPORT = "kztts export MODEL_DIR -o BUNDLE --target TARGET"

GRAPHS: dict[str, GraphKind] = {g.name: g for g in (
    GraphKind("talker", "talker", "dynamic", "Talker, prefill and decode, KV on the host",
              ("inputs_embeds", "rope_cos", "rope_sin"), ("logits", "hidden"), DYNAMIC_KV),
    GraphKind("talker_gqa", "talker", "dynamic", "Talker over ORT GroupQueryAttention, KV written in place",
              ("inputs_embeds", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"),
              ("logits", "hidden"), FUSED_KV, fused=True),
    GraphKind("talker_prefill", "talker", "static", "Talker prefill chunk (HTP)",
              ("inputs_embeds", "attention_mask", "rope_cos", "rope_sin"), ("logits", "hidden"), STATIC_KV,
              placement_key="talker_prefill", exported_by=_TARGET_EXPORT),
    GraphKind("talker_decode", "talker", "static", "Talker one position (HTP)",
              ("inputs_embeds", "attention_mask", "rope_cos", "rope_sin"), ("logits", "hidden"), STATIC_KV,
              placement_key="talker_decode", exported_by=_TARGET_EXPORT),
    GraphKind("cp_step", "code_predictor", "dynamic", "Code Predictor, one codebook per run, host sampler",
              ("inputs_embeds", "rope_cos", "rope_sin", "step"), ("logits",), DYNAMIC_KV),
    GraphKind("cp_frame", "code_predictor", "static", "Code Predictor, 15 steps and the sampler in one graph",
              ("hidden", "c0_embed", *_SAMPLER), ("codes", "embedding_sum"), placement_key="cp_frame"),
    GraphKind("cp_frame_gqa", "code_predictor", "dynamic", "cp_frame over ORT GroupQueryAttention",
              ("hidden", "c0_embed", *_SAMPLER), ("codes", "embedding_sum"), fused=True),
    # continuous batching (kztts.tts.batch_loop): the fused graphs with a batch dimension, one row per stream
    GraphKind("talker_batched", "talker", "dynamic", "talker_gqa over B rows, each its own KV length",
              ("inputs_embeds", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"),
              ("logits", "hidden"), FUSED_KV, fused=True),
    GraphKind("cp_frame_batched", "code_predictor", "dynamic", "cp_frame_gqa over B rows, each its own sampling",
              ("hidden", "c0_embed", *_SAMPLER), ("codes", "embedding_sum"), fused=True),
    GraphKind("decoder", "decoder", "dynamic", "speech decoder, whole utterance", ("codes",), ("wav",)),
    GraphKind("decoder_stream", "decoder", "dynamic", "speech decoder, streaming with carried state",
              ("codes", "position"), ("wav",)),
    GraphKind("decoder_chunk", "decoder", "static", "speech decoder over a fixed chunk of frames (HTP)",
              ("codes", "position"), ("wav",), placement_key="decoder",
              exported_by=_TARGET_EXPORT + " (a target whose placement.decoder is htp)"),
    GraphKind("encoder", "speech_encoder", "dynamic", "speech tokenizer encoder (ICL voices)", ("wav",), ("codes",)),
    GraphKind("speaker_encoder", "speaker_encoder", "dynamic", "speaker x-vector from a log-mel",
              ("mel",), ("xvector",)),
)}

# Hybrid LMs (Qwen3-Next / Qwen3.5, manifest model_type "qwen3_next"; ``kztts.export.lm.hybrid``): one graph
# per phase over the whole stack. A ``full_attention`` layer l has KV I/O named by the graph's KV scheme with
# kinds "key"/"value"; a ``linear_attention`` (Gated DeltaNet) layer l has its two state tensors as I/O under
# the same scheme with kinds "conv_state" [1, conv_dim, kernel-1] and "recurrent_state" [1, v_heads, dk, dv]
# (whole states in, whole updated states out). CPU graphs: ``hybrid_prefill`` (the chunked delta rule, any
# T up to the manifest's ``chunk``) and ``hybrid_decode`` (the recurrent form, T = 1); with --target, the
# static ``hybrid_static_prefill`` (S positions, ``token_mask``) and ``hybrid_static_decode`` (one
# position), keys transposed as the static Talker's, with per-layer magnitude probes.
HYBRID_FULL, HYBRID_LINEAR = "full_attention", "linear_attention"
HYBRID_STATE_KINDS = ("conv_state", "recurrent_state")
HYBRID_KV_KINDS = ("key", "value")
HYBRID_MODEL_TYPES = ("qwen3_next",)
HYBRID_CPU_GRAPHS = ("hybrid_prefill", "hybrid_decode")
HYBRID_STATIC_GRAPHS = ("hybrid_static_prefill", "hybrid_static_decode")
# The static hybrid graphs' ``layer_stats`` rows: a full-attention layer's are LAYER_STATS
# (kztts.bundle.segments) then zeros, a DeltaNet layer's these (the largest |x| of each).
DELTANET_STATS = ("residual_in", "attn_norm_out", "in_proj", "conv_out", "recurrent_state", "core_out",
                  "gated_norm_out", "attn_out", "residual_mid", "mlp_norm_out", "mlp_intermediate", "mlp_out",
                  "residual_out")
_HYBRID_EXPORT = "kztts export HYBRID_DIR -o BUNDLE"
GRAPHS.update({g.name: g for g in (
    GraphKind("hybrid_prefill", "talker", "dynamic", "hybrid LM, chunked delta rule, KV and states on the host",
              ("inputs_embeds", "rope_cos", "rope_sin"), ("logits", "hidden"), DYNAMIC_KV, exported_by=_HYBRID_EXPORT),
    GraphKind("hybrid_decode", "talker", "dynamic", "hybrid LM, one position, recurrent delta rule",
              ("inputs_embeds", "rope_cos", "rope_sin"), ("logits", "hidden"), DYNAMIC_KV, exported_by=_HYBRID_EXPORT),
    GraphKind("hybrid_static_prefill", "talker", "static", "hybrid LM prefill chunk (HTP), chunked delta rule",
              ("inputs_embeds", "attention_mask", "rope_cos", "rope_sin", "token_mask"), ("logits", "hidden"),
              STATIC_KV, placement_key="talker_prefill", exported_by=_HYBRID_EXPORT + " --target TARGET"),
    GraphKind("hybrid_static_decode", "talker", "static", "hybrid LM one position (HTP), recurrent delta rule",
              ("inputs_embeds", "attention_mask", "rope_cos", "rope_sin"), ("logits", "hidden"), STATIC_KV,
              placement_key="talker_decode", exported_by=_HYBRID_EXPORT + " --target TARGET"),
)})


def hybrid_cache_names(layer_types, scheme: KVNames, new: bool = False) -> list[str]:
    """The cache inputs (``new``: outputs) of a hybrid graph, in layer order: each full-attention layer's
    key and value, each DeltaNet layer's conv and recurrent state, under ``scheme``."""
    name = scheme.new_name if new else scheme.past_name
    return [name(k, i) for i, t in enumerate(layer_types)
            for k in (HYBRID_KV_KINDS if t == HYBRID_FULL else HYBRID_STATE_KINDS)]


# Names of the per-layer Talker graphs start with one of these (``kztts.bundle.segments.segment_graph_name``).
SEGMENT_PREFIXES = ("talker_prefill_", "talker_decode_")
# A causal-LM bundle (manifest kind "lm", ``kztts.export.lm.bundle_writer``) holds the Talker's graph kinds
# over the LM's decoder stack (its head is the graphs' head; the token embedding is a table) and,
# with --segments, the per-layer graphs.
LM_GRAPH_KINDS = ("talker", "talker_gqa", "talker_batched", "talker_prefill", "talker_decode")

# Per-layer Talker graphs (``kztts export --target T --segments``): names from ``segment_graph_name``.
SEGMENT_EXPORT = "kztts export MODEL_DIR -o BUNDLE --target TARGET --segments"

# The target file's ``placement`` keys, in execution order; ``speaker_encoder`` may be omitted.
PLACEMENT_KEYS = ("talker_prefill", "talker_decode", "cp_frame", "decoder", "speaker_encoder")
OPTIONAL_PLACEMENT_KEYS = ("speaker_encoder",)


def htp_kv_dtype(precision: str, requested: str | None = None) -> str:
    """The KV I/O dtype of static Talker graphs of ``precision``: ``requested`` when allowed, else the
    default; raises ValueError naming the allowed ones."""
    allowed = HTP_KV_DTYPES[precision]
    if requested is None:
        return allowed[0]
    if requested not in allowed:
        raise ValueError(f"KV dtype {requested!r} is not available for {precision} graphs "
                         f"(allowed: {', '.join(allowed)})")
    return requested


def kind(name: str) -> GraphKind:
    """The registry entry of graph ``name``."""
    try:
        return GRAPHS[name]
    except KeyError:
        raise KeyError(f"unknown graph kind {name!r} (known: {', '.join(GRAPHS)})") from None


def graphs_of_role(role: str) -> list[GraphKind]:
    return [g for g in GRAPHS.values() if g.role == role]


def kv_names(name: str) -> KVNames:
    """The KV naming scheme of graph ``name`` (segment graphs included)."""
    if name.startswith(SEGMENT_PREFIXES):
        return SEGMENT_KV
    scheme = kind(name).kv
    if scheme is None:
        raise KeyError(f"graph {name!r} has no KV inputs")
    return scheme


def require(manifest, graph: str, *, feature: str, inputs: tuple[str, ...] = (), how: str | None = None) -> None:
    """Refuse a bundle that lacks ``graph`` (or one of its ``inputs``) needed by ``feature``:
    one line naming the feature and the export command that adds it."""
    spec = manifest.graphs.get(graph)
    cmd = how or (GRAPHS[graph].exported_by if graph in GRAPHS else _TARGET_EXPORT)
    where = getattr(manifest, "path", "the bundle")
    if spec is None:
        raise BundleError(f"{where}: {feature} needs graph {graph!r}, which this bundle lacks; "
                          f"re-export it with `{cmd}`")
    have = {t.name for t in spec.inputs}
    missing = [i for i in inputs if i not in have]
    if missing:
        raise BundleError(f"{where}: {feature} needs input {missing[0]!r} of graph {graph!r}, which this "
                          f"bundle's graph lacks (an older export); re-export it with `{cmd}`")
