"""The Talker runner: prefill and decode over the exported graph, KV kept on the host."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from kztts.errors import KzttsError
from kztts.kv_cache import KVCache, kv_dtype
from kztts.rope import rope_tables

DEFAULT_CONTEXT = 4096


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
        self._out_names = ["logits", "hidden"] + [
            f"new_{kind}_{i}" for i in range(self.num_layers) for kind in ("key", "value")]

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
        t = embeds.shape[0]
        self.kv.check_room(t)
        p = self.kv.length
        feed = {
            "inputs_embeds": np.ascontiguousarray(embeds, dtype=np.float32)[None],
            "rope_cos": self._cos[None, p:p + t],
            "rope_sin": self._sin[None, p:p + t],
        }
        for i in range(self.num_layers):
            feed[f"past_key_{i}"], feed[f"past_value_{i}"] = self.kv.past(i)
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
