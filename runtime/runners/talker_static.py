"""The Talker over the static HTP graphs: a ``TalkerRunner`` (``kztts.runners.protocol``).

Two graphs of one static context ``C`` (``kztts.export.htp.static_graphs``): a prefill
chunk of ``S`` positions and an AR-1 decode step. The host keeps the KV cache in
the graphs' own layout (keys ``[kv, 1, head_dim, C-1]``, values ``[kv, 1, C-1,
head_dim]`` per layer), passes it whole to decode (no copy) and its first ``C-S``
slots to prefill, and writes the graphs' new entries into it. Slot ``j`` holds
position ``j``; the additive mask marks the filled slots and the causal part of
the new positions, so the zero-initialised tail never needs clearing.

A prompt of ``T`` positions runs ``ceil(T / S)`` prefill chunks (the last one
padded); positions that no longer fit a chunk (past ``C - S``) run through the
decode graph one by one. Usable context: ``C - 1`` positions.

The cache has the graphs' KV type (float32, float16 for fp16 HTP graphs, uint8 for w8a16
graphs with 8-bit KV; read from the graph inputs, so older fp32 bundles run as before). The
decode step is bound once (``ort.IOBinding``): the whole cache as its past inputs, small
per-step input buffers filled in place, the new-KV outputs written into preallocated
buffers; nothing is passed per call. ``kv_bytes`` / ``calls`` count the KV bytes each phase
moved through the graph boundary (past inputs + new outputs).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np
import onnxruntime as ort

from kztts.bundle.graphs import KV_UINT8_ZERO_POINT, STATIC_KV
from kztts.bundle.segments import STATIC_STATS
from kztts.core.errors import BundleError, KzttsError
from kztts.htp.saturation import SaturationGuard
from kztts.runners.kv_binding import DecodeBinding, kv_buffers
from kztts.runners.kv_cache import check_room, kv_dtype
from kztts.runners.rope import rope_tables

PREFILL = "talker_prefill"
DECODE = "talker_decode"


def _shape(sess: ort.InferenceSession, name: str) -> list[int]:
    for a in sess.get_inputs():
        if a.name == name:
            if not all(isinstance(d, int) for d in a.shape):
                raise BundleError(f"static talker graph input {name} has a dynamic shape {a.shape}")
            return list(a.shape)
    raise BundleError(f"static talker graph has no input {name!r}")


def chunk_inputs(embeds: np.ndarray, n: int, seq: int, filled: int, context: int, hidden: int,
                 mask_value: float) -> tuple[np.ndarray, np.ndarray]:
    """The padded input [1, seq, H] of ``n`` new positions and its additive mask [1, 1, seq, C]
    (cache slots ``0..filled-1`` valid, the new positions causal among themselves)."""
    x = np.zeros((1, seq, hidden), np.float32)
    x[0, :n] = embeds
    mask = np.full((1, 1, seq, context), mask_value, np.float32)
    mask[0, 0, :, :filled] = 0.0
    mask[0, 0, :, context - seq:][np.tril(np.ones((seq, seq), bool))] = 0.0
    return x, mask


class ChunkedTalker:
    """The ``Talker`` API over static graphs of context ``graph_context``: a prefill chunk of
    ``chunk`` positions and an AR-1 decode step. Subclasses set ``hidden_size``, ``chunk``,
    ``graph_context``, ``length`` and implement ``_run_chunk(phase, embeds, n, seq)``."""

    hidden_size: int
    chunk: int
    graph_context: int
    length: int

    @property
    def position(self) -> int:
        return self.length

    @property
    def context(self) -> int:
        """Positions the cache holds (the graphs' static context minus one)."""
        return self.graph_context - 1

    def reset(self) -> None:
        self.length = 0

    def _check_room(self, n: int) -> None:
        check_room(self.length, n, self.context, "export with a larger static context")

    def _run_chunk(self, phase: str, embeds: np.ndarray, n: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _append(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = embeds.shape[0]
        self._check_room(t)
        S, C = self.chunk, self.graph_context
        done, result = 0, None
        while done < t:
            left = t - done
            if left > 1 and self.length <= C - S:
                n = min(S, left)
                result = self._run_chunk("prefill", embeds[done:done + n], n, S)
            else:
                n = 1
                result = self._run_chunk("decode", embeds[done:done + 1], 1, 1)
            done += n
        return result

    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run a fresh prompt ([T, H]); the cache is reset first."""
        if embeds.ndim != 2 or embeds.shape[1] != self.hidden_size or embeds.shape[0] == 0:
            raise KzttsError(f"prefill expects embeddings [T>0, {self.hidden_size}], got {embeds.shape}")
        self.reset()
        return self._append(np.asarray(embeds, dtype=np.float32))

    def decode(self, embed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append one position ([H]) and return its logits and hidden."""
        if embed.shape != (self.hidden_size,):
            raise KzttsError(f"decode expects one embedding [{self.hidden_size}], got {embed.shape}")
        if self.length == 0:
            raise KzttsError("decode called before prefill")
        return self._append(np.asarray(embed, dtype=np.float32)[None])

    def extend(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append positions ([T, H]) after those in the cache (a chat's next turn)."""
        return self._append(np.asarray(embeds, dtype=np.float32))


class StaticTalker(ChunkedTalker):
    """``prefill(embeds[T, H])`` then ``decode(embed[H])``; both return (logits [vocab], hidden [H]).

    ``io_binding``: bind the decode step once (default) or pass arrays per call (A/B runs).
    ``kv_scales``: {"key": [per layer], "value": [...]} of uint8 KV graphs (manifest ``kv_scales``),
    needed only to read the cache back as floats (``float_kv``, the CPU handover).
    ``guard``: a ``kztts.htp.saturation.SaturationGuard`` that checks the graphs' magnitude probes
    (``layer_stats``, ``head_stats``) on every call; graphs exported without probes are not checked
    (``probed`` is False)."""

    def __init__(self, prefill_session: ort.InferenceSession, decode_session: ort.InferenceSession,
                 config: dict, mask_value: float = -50.0, *, io_binding: bool = True,
                 kv_scales: dict | None = None, guard: SaturationGuard | None = None):
        self.prefill_session, self.decode_session = prefill_session, decode_session
        self.num_layers = int(config["num_layers"])
        self.hidden_size = int(config["hidden"])
        self.vocab = int(config["vocab"])
        kv, hd = int(config["num_kv_heads"]), int(config["head_dim"])
        self.num_kv_heads, self.head_dim = kv, hd
        self.mask_value = np.float32(mask_value)
        S = _shape(prefill_session, "inputs_embeds")[1]
        first_key = STATIC_KV.past_name("key", 0)
        P = _shape(prefill_session, first_key)[3]
        Pd = P + S - 1 if decode_session is None else _shape(decode_session, first_key)[3]  # None: prefill-only
        self.chunk, self.graph_context = S, P + S
        if decode_session is not None and _shape(decode_session, "inputs_embeds")[1] != 1 \
                or Pd + 1 != self.graph_context:
            raise BundleError(f"static talker graphs disagree: prefill context {P + S}, decode context {Pd + 1} "
                              "(decode must take one position); re-export the bundle")
        if _shape(prefill_session, first_key) != [kv, 1, hd, P]:
            raise BundleError(f"static talker graph {first_key} is {_shape(prefill_session, first_key)}, "
                              f"the manifest config says [{kv}, 1, {hd}, {P}]")
        self.kv_dtype = kv_dtype(prefill_session, first_key)
        if decode_session is not None and kv_dtype(decode_session, first_key) != self.kv_dtype:
            raise BundleError(f"static talker graphs disagree on the KV type: prefill {self.kv_dtype}, decode "
                              f"{kv_dtype(decode_session, first_key)}; re-export the bundle")
        C = self.graph_context
        if C - 1 > int(config["max_positions"]):
            raise KzttsError(f"static talker context {C} exceeds the model's {config['max_positions']} positions")
        # uint8 slots start at the zero point (value 0.0), as the float caches start at 0.0
        fill = KV_UINT8_ZERO_POINT if self.kv_dtype == np.uint8 else 0
        self._fill = fill
        L = self.num_layers
        buffers, self._shared = kv_buffers(decode_session or prefill_session, [(kv, 1, hd, C - 1)] * L + [(kv, 1, C - 1, hd)] * L,
                                           self.kv_dtype, fill)
        self.keys, self.values = buffers[:L], buffers[L:]
        self.kv_scales = kv_scales
        self._cos, self._sin = rope_tables(C + S, hd, float(config["rope_theta"]))
        self.length = 0
        self._out_names = ["logits", "hidden"] + STATIC_KV.new_names(self.num_layers)
        self.probed = set(STATIC_STATS) <= {o.name for o in prefill_session.get_outputs()}
        self.guard = guard if self.probed else None
        self._stat_names = list(STATIC_STATS) if self.guard is not None else []
        self._past_names = STATIC_KV.past_names(self.num_layers)
        self.on_feed: Callable[[str, dict], None] | None = None  # calibration hook: (graph name, feed)
        self.io_binding = io_binding and hasattr(decode_session, "io_binding")
        self._binding: DecodeBinding | None = None
        self.kv_bytes: Counter = Counter()  # phase -> KV bytes in + out over all calls
        self.calls: Counter = Counter()  # phase -> graph calls

    def kv_bytes_per_call(self, phase: str) -> float:
        """Mean KV bytes (past inputs + new outputs) one ``phase`` graph call moved."""
        return self.kv_bytes[phase] / self.calls[phase] if self.calls[phase] else 0.0

    def float_kv(self, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The first ``n`` cached positions as float32 keys and values [1, kv, n, hd] per layer."""
        keys = [k[..., :n].transpose(1, 0, 3, 2) for k in self.keys]  # [kv,1,hd,n] -> [1,kv,n,hd]
        values = [v[:, :, :n].transpose(1, 0, 2, 3) for v in self.values]
        if self.kv_dtype != np.uint8:
            return [k.astype(np.float32) for k in keys], [v.astype(np.float32) for v in values]
        if not self.kv_scales:
            raise BundleError("the static Talker's KV is uint8 but its scales are unknown (manifest kv_scales); "
                              "re-export the bundle")

        def deq(q: np.ndarray, scale: float) -> np.ndarray:
            return (q.astype(np.float32) - KV_UINT8_ZERO_POINT) * np.float32(scale)

        return ([deq(k, s) for k, s in zip(keys, self.kv_scales["key"])],
                [deq(v, s) for v, s in zip(values, self.kv_scales["value"])])

    def reset(self) -> None:
        # the slots a previous utterance wrote go back to 0.0: the mask is finite (-50, fp16-safe), so a
        # masked slot's score still enters the softmax, with a weight of exp(score - 50) that a stale key
        # can make count (a w8a16 text's perplexity moved with the text before it)
        for k, v in zip(self.keys, self.values):
            k[..., :self.length] = self._fill
            v[:, :, :self.length] = self._fill
        super().reset()
        if self.guard is not None:
            self.guard.new_utterance()

    def _check(self, phase: str, layer_stats: np.ndarray, head_stats: np.ndarray) -> None:
        """The guard's look at one call's probes: every layer, then the head."""
        for i, stats in enumerate(layer_stats):
            self.guard.check(phase, i, stats)
        self.guard.check(phase, "head", head_stats)

    def _write_new(self, p: int, n: int, new: list[np.ndarray]) -> None:
        for i in range(self.num_layers):
            self.keys[i][..., p:p + n] = new[2 * i][..., :n]
            self.values[i][:, :, p:p + n] = new[2 * i + 1][:, :, :n]

    def _run(self, graph: str, sess: ort.InferenceSession, embeds: np.ndarray, n: int, seq: int):
        p, C = self.length, self.graph_context
        P = C - seq
        x, mask = chunk_inputs(embeds, n, seq, p, C, self.hidden_size, self.mask_value)
        feed = {"inputs_embeds": x, "attention_mask": mask,
                "rope_cos": self._cos[None, p:p + seq], "rope_sin": self._sin[None, p:p + seq]}
        for i in range(self.num_layers):
            key, value = self._past_names[2 * i], self._past_names[2 * i + 1]
            if P == C - 1:
                feed[key], feed[value] = self.keys[i], self.values[i]
            else:
                feed[key] = np.ascontiguousarray(self.keys[i][..., :P])
                feed[value] = np.ascontiguousarray(self.values[i][:, :, :P])
        if self.on_feed is not None:
            self.on_feed(graph, feed)
        out = sess.run(self._out_names + self._stat_names, feed)
        phase = "decode" if seq == 1 else "prefill"
        kv_new = out[2:len(self._out_names)]
        self.kv_bytes[phase] += sum(feed[k].nbytes for k in self._past_names) + sum(o.nbytes for o in kv_new)
        self.calls[phase] += 1
        if self._stat_names:
            self._check(phase, *out[len(self._out_names):])
        self._write_new(p, n, kv_new)
        self.length = p + n
        return out[0][0, n - 1], out[1][0, n - 1]

    def _decode_bound(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._binding is None:
            past = dict(zip(self._past_names, [a for kv in zip(self.keys, self.values) for a in kv]))
            self._binding = DecodeBinding(self.decode_session, past, self._past_names, self._out_names[2:])
        b, p, C = self._binding, self.length, self.graph_context
        b.inputs["inputs_embeds"][0, 0] = embeds[0]
        mask = b.inputs["attention_mask"][0, 0, 0]
        mask[:] = self.mask_value
        mask[:p] = 0.0
        mask[C - 1] = 0.0  # the new position itself
        b.inputs["rope_cos"][0, 0], b.inputs["rope_sin"][0, 0] = self._cos[p], self._sin[p]
        if self.on_feed is not None:
            self.on_feed(DECODE, dict(b.inputs))
        b.run()
        if self._stat_names:
            self._check("decode", *(b.outputs[name] for name in self._stat_names))
        new = [b.outputs[name] for name in self._out_names[2:]]
        self.kv_bytes["decode"] += b.kv_bytes
        self.calls["decode"] += 1
        self._write_new(p, 1, new)
        self.length = p + 1
        # the output buffers are reused by the next step: hand out copies
        return b.outputs["logits"][0, 0].copy(), b.outputs["hidden"][0, 0].copy()

    def _run_chunk(self, phase: str, embeds: np.ndarray, n: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        if phase == "prefill":
            return self._run(PREFILL, self.prefill_session, embeds, n, seq)
        if self.io_binding:
            return self._decode_bound(embeds)
        return self._run(DECODE, self.decode_session, embeds, n, seq)
