"""The Talker runner: prefill and decode over the exported graph, KV kept on the host.

Two CPU graphs serve it: ``talker`` (plain ONNX ops; returns the new keys/values, which
are copied into the host cache) and ``talker_gqa`` (ONNX Runtime's fused
GroupQueryAttention, ``kztts.export.graphs.gqa_graphs``), which writes the new positions into
the host cache itself: each layer's buffer is bound as both its past input and its
present output, so nothing is copied per step.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from kztts.bundle.graphs import DYNAMIC_KV, FUSED_KV
from kztts.core.errors import KzttsError
from kztts.runners.kv_cache import KVCache, kv_dtype
from kztts.runners.rope import rope_tables

DEFAULT_CONTEXT = 4096


def _input_names(session) -> set[str]:
    get_inputs = getattr(session, "get_inputs", None)
    return {i.name for i in get_inputs()} if get_inputs is not None else set()


class _FusedRun:
    """One ``talker_gqa`` run with IO binding: the KV buffers of ``kv`` are both the past
    inputs and the present outputs; logits and hidden land in preallocated arrays."""

    def __init__(self, session, kv: KVCache, cos: np.ndarray, sin: np.ndarray, vocab: int, hidden: int):
        self.session = session
        self.kv = kv
        half = cos.shape[1] // 2
        table = np.dtype(np.float16) if kv.dtype == np.float16 else np.dtype(np.float32)
        self._cos = np.ascontiguousarray(cos[:, :half], dtype=table)
        self._sin = np.ascontiguousarray(sin[:, :half], dtype=table)
        self._logits = np.empty((1, vocab), np.float32)
        self._hidden = np.empty((1, hidden), np.float32)
        self._io = session.io_binding()
        self._io.bind_cpu_input("cos_cache", self._cos)
        self._io.bind_cpu_input("sin_cache", self._sin)
        for name, arr in (("logits", self._logits), ("hidden", self._hidden)):
            self._io.bind_output(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        self._generation = -1

    def _bind_kv(self) -> None:
        for i in range(self.kv.num_layers):
            for kind, bufs in (("key", self.kv.keys), ("value", self.kv.values)):
                b = bufs[i]
                self._io.bind_input(FUSED_KV.past_name(kind, i), "cpu", 0, b.dtype, list(b.shape), b.ctypes.data)
                self._io.bind_output(FUSED_KV.new_name(kind, i), "cpu", 0, b.dtype, list(b.shape), b.ctypes.data)
        self._generation = self.kv.generation

    def __call__(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = embeds.shape[0]
        self.kv.reserve(t)
        if self._generation != self.kv.generation:
            self._bind_kv()
        total = self.kv.length + t
        x = np.ascontiguousarray(embeds, dtype=np.float32)[None]
        self._io.bind_cpu_input("inputs_embeds", x)
        self._io.bind_cpu_input("seqlens_k", np.array([total - 1], np.int32))
        self._io.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        self.session.run_with_iobinding(self._io)
        self.kv.advance(t)
        return self._logits[0].copy(), self._hidden[0].copy()


class Talker:
    """Drives the Talker graph: ``prefill(embeds)`` then ``decode(embed)`` per frame.

    Both return (logits [vocab], hidden [H]) of the last position; ``hidden`` is
    the final-norm hidden state that feeds the Code Predictor. Positions are
    counted here (0, 1, 2, ...), never inferred by a graph.
    """

    def __init__(self, session: ort.InferenceSession, config: dict, context: int = DEFAULT_CONTEXT):
        self.session = session
        self.num_layers = int(config["num_layers"])
        self.hidden_size = int(config["hidden"])
        self.vocab = int(config["vocab"])
        head_dim = int(config["head_dim"])
        limit = int(config["max_positions"])
        if not 0 < context <= limit:
            raise KzttsError(f"talker context {context} must be in 1..{limit} (the model's max positions)")
        self.kv = KVCache(self.num_layers, int(config["num_kv_heads"]), head_dim, context, kv_dtype(session))
        self._cos, self._sin = rope_tables(context, head_dim, float(config["rope_theta"]))
        self._out_names = ["logits", "hidden"] + DYNAMIC_KV.new_names(self.num_layers)
        self._past_names = DYNAMIC_KV.past_names(self.num_layers)
        self.fused = "seqlens_k" in _input_names(session)
        self._fused_run = (_FusedRun(session, self.kv, self._cos, self._sin, self.vocab, self.hidden_size)
                           if self.fused else None)

    @property
    def position(self) -> int:
        """Number of positions already in the KV cache (the next position's index)."""
        return self.kv.length

    @property
    def context(self) -> int:
        return self.kv.context

    def reset(self) -> None:
        self.kv.reset()

    def _run(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._fused_run is not None:
            return self._fused_run(embeds)
        t = embeds.shape[0]
        self.kv.check_room(t)
        p = self.kv.length
        feed = {
            "inputs_embeds": np.ascontiguousarray(embeds, dtype=np.float32)[None],
            "rope_cos": self._cos[None, p:p + t],
            "rope_sin": self._sin[None, p:p + t],
        }
        for i in range(self.num_layers):
            feed[self._past_names[2 * i]], feed[self._past_names[2 * i + 1]] = self.kv.past(i)
        out = self.session.run(self._out_names, feed)
        self.kv.append(out[2::2], out[3::2])
        return out[0][0], out[1][0]

    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run a fresh prompt ([T, H]); the cache is reset first."""
        if embeds.ndim != 2 or embeds.shape[1] != self.hidden_size or embeds.shape[0] == 0:
            raise KzttsError(f"prefill expects embeddings [T>0, {self.hidden_size}], got {embeds.shape}")
        self.reset()
        return self._run(embeds)

    def decode(self, embed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append one position ([H]) and return its logits and hidden."""
        if embed.shape != (self.hidden_size,):
            raise KzttsError(f"decode expects one embedding [{self.hidden_size}], got {embed.shape}")
        if self.kv.length == 0:
            raise KzttsError("decode called before prefill")
        return self._run(embed[None])

    def extend(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append positions ([T, H]) after those in the cache (a chat's next turn); last logits, hidden."""
        if embeds.ndim != 2 or embeds.shape[1] != self.hidden_size or embeds.shape[0] == 0:
            raise KzttsError(f"extend expects embeddings [T>0, {self.hidden_size}], got {embeds.shape}")
        return self._run(embeds)
