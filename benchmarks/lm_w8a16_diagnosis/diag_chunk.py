"""What both w8a16 diagnosis scripts share: one prefill chunk of a text of ``kztts.eval.lm_accuracy.SAMPLES``
(its first chunk's tokens, no chat template) for an fp16 LM bundle with ``--segments`` layer graphs, the
chain of its prefill layer graphs and head, and the comparison of two chunks' logits."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from kztts.bundle.segments import segment_graph_name
from kztts.core.metrics import cosine_rows
from kztts.eval.lm_accuracy import SAMPLES, perplexity
from kztts.runners.rope import rope_tables
from kztts.runners.talker_static import chunk_inputs


def session_options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return so


@dataclass
class Chunk:
    """The first prefill chunk of ``text`` for ``bundle`` (positions 0..n-1, an empty cache)."""

    bundle: Path
    ids: list[int]
    hidden: np.ndarray  # [1, S, H], zero past n
    mask: np.ndarray
    rope_cos: np.ndarray
    rope_sin: np.ndarray
    graphs: list[Path]  # the prefill layer graphs in order, then the head
    past_key: np.ndarray  # zeros, [kv, 1, hd, C - S]
    past_value: np.ndarray

    @classmethod
    def load(cls, bundle: str | Path, text: str) -> "Chunk":
        bundle = Path(bundle)
        man = json.loads((bundle / "kztts.json").read_text())
        cfg, g0 = man["config"]["lm"], man["graphs"][segment_graph_name("prefill", 0)]
        C, S, H, hd, kv = g0["context"], g0["seq"], cfg["hidden"], cfg["head_dim"], cfg["num_kv_heads"]
        ids = Tokenizer.from_file(str(bundle / "tokenizer.json")).encode(
            next(s for s in SAMPLES if s.name == text).text).ids[:S]
        emb = np.load(bundle / "embeddings" / "token_embedding.npy", mmap_mode="r")
        hidden, mask = chunk_inputs(np.asarray(emb[ids], np.float32), len(ids), S, 0, C, H, g0["mask_value"])
        cos, sin = rope_tables(C + S, hd, float(cfg["rope_theta"]))
        graphs = [bundle / man["graphs"][segment_graph_name("prefill", u)]["file"]
                  for u in [*range(cfg["num_layers"]), "head"]]
        return cls(bundle, ids, hidden, mask, cos[None, :S], sin[None, :S], graphs,
                   np.zeros((kv, 1, hd, C - S), np.float32), np.zeros((kv, 1, C - S, hd), np.float32))

    @property
    def n(self) -> int:
        return len(self.ids)

    def layer_chain(self, open_graph: Callable[[Path], ort.InferenceSession]) -> np.ndarray:
        """Logits [n, vocab] of the prefill layer graphs and head, each opened by ``open_graph(path)``."""
        x = self.hidden
        for path in self.graphs[:-1]:
            x = open_graph(path).run(None, {
                "hidden_in": x, "attention_mask": self.mask, "rope_cos": self.rope_cos, "rope_sin": self.rope_sin,
                "past_key_in": self.past_key, "past_value_in": self.past_value})[0]
        return open_graph(self.graphs[-1]).run(None, {"hidden_in": x})[0][0, :self.n]

    def perplexity(self, logits: np.ndarray) -> float:
        return perplexity(logits[:-1], self.ids[1:])

    def compare(self, ref: np.ndarray, logits: np.ndarray) -> str:
        cos = cosine_rows(ref, logits)
        return (f"ppl {self.perplexity(logits):.3f}; logits cos mean {cos.mean():.6f} min {cos.min():.6f} "
                f"(position {int(np.argmin(cos))}); top-1 {np.mean(ref.argmax(-1) == logits.argmax(-1)):.3f}")
