"""The hybrid LM (Qwen3-Next / Qwen3.5, ``qwen3_next``) on the CPU: a ``TalkerRunner`` over ``hybrid_prefill`` and
``hybrid_decode`` (``kztts.export.graphs.hybrid_graphs``).

The cache of a conversation is the KV of the full-attention layers (a ``KVCache`` over them, grown as the
Talker's) and, per Gated DeltaNet layer, its conv state (the last ``kernel - 1`` conv inputs) and its
recurrent state ([1, value heads, key dim, value dim]): fixed-size tensors that every graph call reads
whole and returns updated, whatever the context. A prompt or a chat turn of T positions runs the chunked
graph in calls of at most ``chunk`` positions (the graph's chunked delta rule is exact up to that length);
a single position runs the recurrent decode graph. ``extend`` continues from the cache (a chat's next
turn feeds only its own tokens), and ``load`` takes a cache computed elsewhere (the HTP prefill's, handed
over: ``kztts.runners.hybrid_static``).
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from kztts.bundle.graphs import DYNAMIC_KV, HYBRID_FULL, HYBRID_STATE_KINDS, hybrid_cache_names
from kztts.core.errors import BundleError, KzttsError
from kztts.runners.kv_cache import KVCache, kv_dtype
from kztts.runners.rope import rope_tables

DEFAULT_CONTEXT = 4096
DEFAULT_CHUNK = 64  # the chunked graph's largest call, when its manifest entry does not say


def state_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """A DeltaNet layer's two state tensors, from the manifest's ``config.lm``."""
    return {"conv_state": (1, int(config["conv_dim"]), int(config["conv_kernel"]) - 1),
            "recurrent_state": (1, int(config["linear_num_value_heads"]), int(config["linear_key_head_dim"]),
                                int(config["linear_value_head_dim"]))}


class HybridCache:
    """KV of the attention layers and the two states of every DeltaNet layer, for one conversation."""

    def __init__(self, config: dict, context: int, dtype: np.dtype = np.float32):
        self.layer_types = tuple(config["layer_types"])
        self.attention = [i for i, t in enumerate(self.layer_types) if t == HYBRID_FULL]
        self.deltanet = [i for i, t in enumerate(self.layer_types) if t != HYBRID_FULL]
        self.kv = KVCache(len(self.attention), int(config["num_kv_heads"]), int(config["head_dim"]), context, dtype)
        self.shapes = state_shapes(config)
        self.states = {i: {k: np.zeros(s, np.float32) for k, s in self.shapes.items()} for i in self.deltanet}
        self._slot = {layer: j for j, layer in enumerate(self.attention)}
        self.length = 0  # positions seen (the attention KV holds as many; the states summarise them)

    @property
    def context(self) -> int:
        return self.kv.context

    def reset(self) -> None:
        self.kv.reset()
        for states in self.states.values():
            for a in states.values():
                a.fill(0.0)
        self.length = 0

    def check_room(self, n: int) -> None:
        self.kv.check_room(n)

    def feed(self) -> list[np.ndarray]:
        """The cache inputs in graph order (``hybrid_cache_names``)."""
        out = []
        for i, t in enumerate(self.layer_types):
            if t == HYBRID_FULL:
                out += list(self.kv.past(self._slot[i]))
            else:
                out += [self.states[i][k] for k in HYBRID_STATE_KINDS]
        return out

    def update(self, new: list[np.ndarray], t: int) -> None:
        """Take a graph call's cache outputs (graph order) for ``t`` new positions: the new KV positions
        appended, the states replaced."""
        keys, values = [], []
        for i, t_ in enumerate(self.layer_types):
            a, b = new[2 * i], new[2 * i + 1]
            if t_ == HYBRID_FULL:
                keys.append(a)
                values.append(b)
            else:
                self.states[i] = dict(zip(HYBRID_STATE_KINDS, (a, b)))
        if keys:
            self.kv.append(keys, values)
        self.length += t

    def load(self, keys: list[np.ndarray], values: list[np.ndarray], states: dict[int, dict[str, np.ndarray]],
             length: int) -> None:
        """Replace the cache by one of ``length`` positions (attention keys/values [1, kv, length, hd] per
        attention layer, in layer order; float32 states per DeltaNet layer)."""
        self.reset()
        self.check_room(length)
        if keys:
            self.kv.append([np.asarray(k, self.kv.dtype) for k in keys], [np.asarray(v, self.kv.dtype) for v in values])
        for i in self.deltanet:
            self.states[i] = {k: np.array(states[i][k], np.float32) for k in HYBRID_STATE_KINDS}
        self.length = length


class HybridTalker:
    """``prefill(embeds[T, H])``, ``decode(embed[H])``, ``extend(embeds)``: (logits [vocab], hidden [H]) of the
    last position; the cache in between (module docstring)."""

    def __init__(self, prefill_session: ort.InferenceSession, decode_session: ort.InferenceSession, config: dict,
                 context: int = DEFAULT_CONTEXT, chunk: int = DEFAULT_CHUNK):
        self.prefill_session, self.decode_session = prefill_session, decode_session
        if "layer_types" not in config:
            raise BundleError("a hybrid runner needs config.lm.layer_types; re-export the bundle")
        self.num_layers = int(config["num_layers"])
        self.hidden_size = int(config["hidden"])
        self.vocab = int(config["vocab"])
        limit = int(config["max_positions"])
        if not 0 < context <= limit:
            raise KzttsError(f"hybrid LM context {context} must be in 1..{limit} (the model's max positions)")
        if chunk < 1:
            raise BundleError(f"hybrid prefill chunk {chunk} must be positive; re-export the bundle")
        self.chunk = int(chunk)
        first_kv = next((DYNAMIC_KV.past_name("key", i) for i, t in enumerate(config["layer_types"])
                         if t == HYBRID_FULL), None)
        self.cache = HybridCache(config, context, kv_dtype(decode_session, first_kv) if first_kv else np.float32)
        self._cos, self._sin = rope_tables(context, int(config["rotary_dim"]), float(config["rope_theta"]))
        types = config["layer_types"]
        self._in = hybrid_cache_names(types, DYNAMIC_KV)
        self._out = ["logits", "hidden", *hybrid_cache_names(types, DYNAMIC_KV, new=True)]

    @property
    def position(self) -> int:
        return self.cache.length

    @property
    def context(self) -> int:
        return self.cache.context

    def reset(self) -> None:
        self.cache.reset()

    def _run(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = embeds.shape[0]
        p = self.cache.length
        session = self.decode_session if t == 1 else self.prefill_session
        feed = {"inputs_embeds": np.ascontiguousarray(embeds, dtype=np.float32)[None],
                "rope_cos": self._cos[None, p:p + t], "rope_sin": self._sin[None, p:p + t],
                **dict(zip(self._in, self.cache.feed()))}
        out = session.run(self._out, feed)
        self.cache.update(out[2:], t)
        return out[0][0], out[1][0]

    def _append(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.cache.check_room(embeds.shape[0])
        result = None
        for start in range(0, embeds.shape[0], self.chunk):
            result = self._run(embeds[start:start + self.chunk])
        return result

    def _check(self, embeds: np.ndarray, what: str) -> np.ndarray:
        if embeds.ndim != 2 or embeds.shape[1] != self.hidden_size or embeds.shape[0] == 0:
            raise KzttsError(f"{what} expects embeddings [T>0, {self.hidden_size}], got {embeds.shape}")
        return embeds

    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run a fresh prompt ([T, H]); the cache is reset first."""
        self._check(embeds, "prefill")
        self.reset()
        return self._append(embeds)

    def decode(self, embed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append one position ([H]) and return its logits and hidden."""
        if embed.shape != (self.hidden_size,):
            raise KzttsError(f"decode expects one embedding [{self.hidden_size}], got {embed.shape}")
        if self.cache.length == 0:
            raise KzttsError("decode called before prefill")
        return self._append(embed[None])

    def extend(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append positions ([T, H]) after those in the cache (a chat's next turn)."""
        return self._append(self._check(embeds, "extend"))


__all__ = ["DEFAULT_CHUNK", "DEFAULT_CONTEXT", "HybridCache", "HybridTalker", "state_shapes"]
