"""The hybrid LM on the static HTP graphs (``hybrid_static_prefill`` / ``hybrid_static_decode``), and the
"option C" handover: prefill on the HTP, every state and KV handed to the CPU decode.

``HybridStaticTalker`` is the static Talker's runner (``kztts.runners.talker_static.ChunkedTalker``: chunks of
S positions while they fit, the rest one by one through the decode graph, usable context C - 1) with the
hybrid's cache: the attention layers' KV in the HTP layout (keys [kv, 1, hd, C-1], values [kv, 1, C-1, hd]
of the graphs' KV type) and each DeltaNet layer's conv and recurrent state (float32), which every call
reads whole and returns updated. A chunk's padding (``token_mask`` 0) leaves the states as its valid
tokens left them. Every call's probes (``layer_stats``: each layer's ``LAYER_STATS`` or, for a DeltaNet
layer, ``DELTANET_STATS``; ``head_stats``) go to the fp16 guard; ``on_stats`` sees them too (calibration).

``HybridHandover`` runs the prompt's chunks on the HTP, then hands the attention KV (read back as float32)
and the DeltaNet states (the HTP's own fp16 results, as float32) to the CPU ``HybridTalker``, which decodes
and takes later chat turns. A prompt tail past C - S (where the static runner would go one position at a
time) is prefilled on the CPU after the handover.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from kztts.bundle.graphs import (
    DELTANET_STATS,
    HYBRID_FULL,
    HYBRID_STATE_KINDS,
    STATIC_KV,
    hybrid_cache_names,
)
from kztts.bundle.segments import LAYER_STATS, STATIC_STATS
from kztts.core.errors import BundleError, KzttsError
from kztts.htp.saturation import SaturationGuard
from kztts.runners.hybrid import HybridTalker, state_shapes
from kztts.runners.kv_cache import kv_dtype
from kztts.runners.rope import rope_tables
from kztts.runners.talker_handover import Handover
from kztts.runners.talker_static import ChunkedTalker, chunk_inputs

StatsHook = Callable[[str, np.ndarray, np.ndarray, int], None]  # (phase, layer_stats, head_stats, positions)


def layer_stat_names(layer_types) -> tuple[tuple[str, ...], ...]:
    """The names of each layer's ``layer_stats`` row (the rest of a row is zero padding)."""
    return tuple(LAYER_STATS if t == HYBRID_FULL else DELTANET_STATS for t in layer_types)


def _dims(sess: ort.InferenceSession, name: str) -> list[int]:
    for a in sess.get_inputs():
        if a.name == name:
            if not all(isinstance(d, int) for d in a.shape):
                raise BundleError(f"static hybrid graph input {name} has a dynamic shape {a.shape}")
            return list(a.shape)
    raise BundleError(f"static hybrid graph has no input {name!r}; re-export the bundle with --target")


class HybridStaticTalker(ChunkedTalker):
    """The ``TalkerRunner`` API over the two static hybrid graphs (module docstring). ``decode_session`` None:
    prefill chunks only (the handover's HTP side)."""

    def __init__(self, prefill_session: ort.InferenceSession, decode_session: ort.InferenceSession | None,
                 config: dict, mask_value: float = -50.0, *, guard: SaturationGuard | None = None):
        self.prefill_session, self.decode_session = prefill_session, decode_session
        self.layer_types = tuple(config["layer_types"])
        self.num_layers = len(self.layer_types)
        self.hidden_size = int(config["hidden"])
        self.vocab = int(config["vocab"])
        kv, hd = int(config["num_kv_heads"]), int(config["head_dim"])
        self.num_kv_heads, self.head_dim = kv, hd
        self.attention = [i for i, t in enumerate(self.layer_types) if t == HYBRID_FULL]
        self.mask_value = np.float32(mask_value)
        S = _dims(prefill_session, "inputs_embeds")[1]
        C = _dims(prefill_session, "attention_mask")[3]
        if decode_session is not None and (_dims(decode_session, "inputs_embeds")[1] != 1
                                           or _dims(decode_session, "attention_mask")[3] != C):
            raise BundleError("static hybrid graphs disagree on the static context (decode must take one position of "
                              "the prefill's context); re-export the bundle")
        if C - 1 > int(config["max_positions"]):
            raise KzttsError(f"static hybrid context {C} exceeds the model's {config['max_positions']} positions")
        self.chunk, self.graph_context = S, C
        first = STATIC_KV.past_name("key", self.attention[0]) if self.attention else None
        self.kv_dtype = kv_dtype(prefill_session, first) if first else np.dtype(np.float32)
        self.keys = {i: np.zeros((kv, 1, hd, C - 1), self.kv_dtype) for i in self.attention}
        self.values = {i: np.zeros((kv, 1, C - 1, hd), self.kv_dtype) for i in self.attention}
        self.shapes = state_shapes(config)
        self.states = {i: {k: np.zeros(s, np.float32) for k, s in self.shapes.items()}
                       for i, t in enumerate(self.layer_types) if t != HYBRID_FULL}
        self._cos, self._sin = rope_tables(C + S, int(config["rotary_dim"]), float(config["rope_theta"]))
        self._in = hybrid_cache_names(self.layer_types, STATIC_KV)
        self._out = ["logits", "hidden", *hybrid_cache_names(self.layer_types, STATIC_KV, new=True)]
        have = {o.name for o in prefill_session.get_outputs()}
        if not set(STATIC_STATS) <= have:
            raise BundleError(f"static hybrid graph lacks its probes {STATIC_STATS}; re-export the bundle")
        self.guard = guard
        if guard is not None:
            guard.layer_names = layer_stat_names(self.layer_types)
        self.on_stats: StatsHook | None = None  # calibration
        self.calls = {"prefill": 0, "decode": 0}
        self.length = 0

    def reset(self) -> None:
        super().reset()
        for states in self.states.values():
            for a in states.values():
                a.fill(0.0)
        if self.guard is not None:
            self.guard.new_utterance()

    def _run_chunk(self, phase: str, embeds: np.ndarray, n: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        sess = self.prefill_session if phase == "prefill" else self.decode_session
        if sess is None:
            raise KzttsError("this static hybrid runner has no decode graph (the handover's HTP side)")
        p, C = self.length, self.graph_context
        P = C - seq
        x, mask = chunk_inputs(embeds, n, seq, p, C, self.hidden_size, self.mask_value)
        feed = {"inputs_embeds": x, "attention_mask": mask, "rope_cos": self._cos[None, p:p + seq],
                "rope_sin": self._sin[None, p:p + seq]}
        if phase == "prefill":
            tm = np.zeros((1, seq), np.float32)
            tm[0, :n] = 1.0
            feed["token_mask"] = tm
        names = iter(self._in)
        for i, t in enumerate(self.layer_types):
            if t == HYBRID_FULL:
                k, v = self.keys[i], self.values[i]
                feed[next(names)] = k if P == C - 1 else np.ascontiguousarray(k[..., :P])
                feed[next(names)] = v if P == C - 1 else np.ascontiguousarray(v[:, :, :P])
            else:
                for kind in HYBRID_STATE_KINDS:
                    feed[next(names)] = self.states[i][kind]
        out = sess.run(self._out + list(STATIC_STATS), feed)
        layer_stats, head_stats = out[len(self._out):]
        if self.guard is not None:
            for i, row in enumerate(layer_stats):
                self.guard.check(phase, i, row)
            self.guard.check(phase, "head", head_stats)
        if self.on_stats is not None:
            self.on_stats(phase, layer_stats, head_stats, n)
        new = out[2:len(self._out)]
        for i, t in enumerate(self.layer_types):
            a, b = new[2 * i], new[2 * i + 1]
            if t == HYBRID_FULL:
                self.keys[i][..., p:p + n] = a[..., :n]
                self.values[i][:, :, p:p + n] = b[:, :, :n]
            else:
                self.states[i] = dict(zip(HYBRID_STATE_KINDS, (a, b)))
        self.calls[phase] += 1
        self.length = p + n
        return out[0][0, n - 1], out[1][0, n - 1]

    def prefill_chunks(self, embeds: np.ndarray) -> tuple[int, tuple[np.ndarray, np.ndarray]]:
        """A fresh cache from the leading positions of ``embeds`` that prefill chunks take (while the cache
        holds at most C - S); (positions taken, the last one's logits and hidden)."""
        embeds = np.asarray(embeds, dtype=np.float32)
        if embeds.ndim != 2 or embeds.shape[1] != self.hidden_size or embeds.shape[0] == 0:
            raise KzttsError(f"prefill expects embeddings [T>0, {self.hidden_size}], got {embeds.shape}")
        self.reset()
        self._check_room(embeds.shape[0])
        S, C = self.chunk, self.graph_context
        done, result = 0, None
        while done < embeds.shape[0] and self.length <= C - S:
            n = min(S, embeds.shape[0] - done)
            result = self._run_chunk("prefill", embeds[done:done + n], n, S)
            done += n
        return done, result

    def float_cache(self) -> tuple[list[np.ndarray], list[np.ndarray], dict[int, dict[str, np.ndarray]]]:
        """The cache as float32: keys and values [1, kv, length, hd] per attention layer, the states."""
        n = self.length
        keys = [self.keys[i][..., :n].transpose(1, 0, 3, 2).astype(np.float32) for i in self.attention]
        values = [self.values[i][:, :, :n].transpose(1, 0, 2, 3).astype(np.float32) for i in self.attention]
        return keys, values, {i: {k: a.astype(np.float32) for k, a in s.items()} for i, s in self.states.items()}


class HybridHandover(Handover):
    """``prefill`` on the static HTP graphs, then every state and KV to the CPU ``HybridTalker`` (module docstring)."""

    prefill_talker: HybridStaticTalker
    decode_talker: HybridTalker

    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The prompt's chunks on the HTP, the cache handed over, any tail prefilled on the CPU."""
        embeds = np.asarray(embeds, dtype=np.float32)
        self.decode_talker.reset()
        self.decode_talker.cache.check_room(embeds.shape[0])  # before the HTP work, not after it
        done, result = self.prefill_talker.prefill_chunks(embeds)
        keys, values, states = self.prefill_talker.float_cache()
        self.decode_talker.cache.load(keys, values, states, self.prefill_talker.length)
        if self.keep_handover:
            self.handed_over = (keys, values, states)
        if done < embeds.shape[0]:
            result = self.decode_talker.extend(embeds[done:])
        return result
