"""Runners of the batched CPU graphs (``talker_batched``, ``cp_frame_batched``): B streams per run.

``BatchedTalker`` keeps one KV buffer [rows, kv_heads, capacity, head_dim] per layer and one
length per row (ragged KV). A row is prefilled alone (the graph at batch 1, bound to that row's
slice of the buffers); the active rows 0..n-1 decode together, each at its own position
(``seqlens_k`` = its length). The fused attention writes every new key/value in place (each
buffer is bound as both past and present, as ``kztts.runners.talker`` does for one stream). When a row
leaves, ``keep`` moves the rows that stay down to 0..k-1 (only their filled positions are
copied), so a decode never computes a finished row.

``BatchedCodePredictor`` runs one frame of the Code Predictor for n rows, each with its own
hidden, c0, sampling settings and 15 uniforms.

Rows never mix inside the graphs, so each row gets the numbers its stream would get alone
(the batch-1 graphs ``talker_gqa`` / ``cp_frame_gqa``): ``tests/tts/test_batch_loop.py`` checks the codes.
"""
from __future__ import annotations

import numpy as np

from kztts.bundle.graphs import FUSED_KV
from kztts.core.errors import ContextOverflowError, KzttsError
from kztts.generation.sampling import SamplingParams
from kztts.runners.kv_cache import kv_dtype
from kztts.runners.rope import rope_tables


class BatchedTalker:
    """``prefill(row, embeds)`` and ``decode(embeds)`` over ``talker_batched``."""

    def __init__(self, session, config: dict, rows: int, capacity: int):
        if rows < 1 or capacity < 1:
            raise KzttsError(f"a batch needs at least one row and one position, got {rows} rows x {capacity}")
        self.session = session
        self.rows, self.capacity = rows, capacity
        self.num_layers = int(config["num_layers"])
        self.hidden_size = int(config["hidden"])
        self.vocab = int(config["vocab"])
        head_dim = int(config["head_dim"])
        dtype = kv_dtype(session, FUSED_KV.past_name("key", 0))
        shape = (rows, int(config["num_kv_heads"]), capacity, head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(self.num_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(self.num_layers)]
        self.lengths = np.zeros(rows, np.int64)
        cos, sin = rope_tables(capacity, head_dim, float(config["rope_theta"]))
        table = np.float16 if dtype == np.float16 else np.float32  # as kztts.runners.talker's fused run
        self._cos = np.ascontiguousarray(cos[:, :head_dim // 2], dtype=table)
        self._sin = np.ascontiguousarray(sin[:, :head_dim // 2], dtype=table)

    def _run(self, first: int, n: int, embeds: np.ndarray, seqlens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One run over rows first..first+n-1 (their buffers bound in place); embeds [n, T, H]."""
        io = self.session.io_binding()
        x = np.ascontiguousarray(embeds, dtype=np.float32)
        io.bind_cpu_input("inputs_embeds", x)
        io.bind_cpu_input("seqlens_k", seqlens.astype(np.int32))
        io.bind_cpu_input("total_sequence_length", np.array(int(seqlens.max()) + 1, np.int32))
        io.bind_cpu_input("cos_cache", self._cos)
        io.bind_cpu_input("sin_cache", self._sin)
        for i in range(self.num_layers):
            for kind, bufs in (("key", self.keys), ("value", self.values)):
                view = bufs[i][first:first + n]  # contiguous: rows are the outer axis
                for bind, name in ((io.bind_input, FUSED_KV.past_name(kind, i)),
                                   (io.bind_output, FUSED_KV.new_name(kind, i))):
                    bind(name, "cpu", 0, view.dtype, list(view.shape), view.ctypes.data)
        logits = np.empty((n, self.vocab), np.float32)
        hidden = np.empty((n, self.hidden_size), np.float32)
        for name, arr in (("logits", logits), ("hidden", hidden)):
            io.bind_output(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        self.session.run_with_iobinding(io)
        return logits, hidden

    def _room(self, row: int, t: int) -> None:
        if self.lengths[row] + t > self.capacity:
            raise ContextOverflowError(f"batch row {row}: {self.lengths[row]} positions used + {t} new > its "
                                       f"capacity {self.capacity}")

    def prefill(self, row: int, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A fresh prompt ([T, H]) into ``row``: (logits [V], hidden [H]) of its last position."""
        if not 0 <= row < self.rows:
            raise KzttsError(f"batch row {row} is not in 0..{self.rows - 1}")
        self.lengths[row] = 0
        t = embeds.shape[0]
        self._room(row, t)
        logits, hidden = self._run(row, 1, embeds[None], np.array([t - 1]))
        self.lengths[row] = t
        return logits[0], hidden[0]

    def decode(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One position for each of rows 0..n-1 (embeds [n, H]): logits [n, V], hidden [n, H]."""
        n = embeds.shape[0]
        for row in range(n):
            self._room(row, 1)
        logits, hidden = self._run(0, n, embeds[:, None], self.lengths[:n].copy())
        self.lengths[:n] += 1
        return logits, hidden

    def decode_rows(self, rows: list[int], embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One position for each of ``rows`` (ascending; embeds [len(rows), H]), the others left as they are:
        one run per stretch of consecutive rows (a row's numbers do not depend on the rows run with it)."""
        if rows == list(range(len(rows))):
            return self.decode(embeds)
        logits = np.empty((len(rows), self.vocab), np.float32)
        hidden = np.empty((len(rows), self.hidden_size), np.float32)
        i = 0
        while i < len(rows):
            j = i
            while j + 1 < len(rows) and rows[j + 1] == rows[j] + 1:
                j += 1
            first, n = rows[i], j - i + 1
            for row in range(first, first + n):
                self._room(row, 1)
            logits[i:j + 1], hidden[i:j + 1] = self._run(first, n, embeds[i:j + 1, None],
                                                         self.lengths[first:first + n].copy())
            self.lengths[first:first + n] += 1
            i = j + 1
        return logits, hidden

    def keep(self, rows: list[int]) -> None:
        """Keep ``rows`` (ascending), moved down to 0..len(rows)-1 in that order; the rest are free."""
        for dst, src in enumerate(rows):
            if src != dst:  # dst < src, and every later source is above src: nothing is overwritten early
                n = int(self.lengths[src])
                for buf in (*self.keys, *self.values):
                    buf[dst, :, :n] = buf[src, :, :n]
                self.lengths[dst] = n
        self.lengths[len(rows):] = 0


class BatchedCodePredictor:
    """``predict(hidden [n, H], c0 [n], samplings, uniforms [n, 15]) -> (codes [n, 15], embedding_sum [n, H])``
    over ``cp_frame_batched``; ``embeddings`` gives C(c0) (``kztts.bundle.embeddings.EmbeddingTables``)."""

    def __init__(self, session, embeddings, num_groups: int):
        self.session = session
        self.embeddings = embeddings
        self.num_groups = num_groups

    def predict(self, hidden: np.ndarray, c0: list[int], samplings: list[SamplingParams],
                uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # as kztts.runners.code_predictor's frame mode: a greedy row is temperature 0, top-k 1
        greedy = [s.is_greedy for s in samplings]
        feed = {
            "hidden": np.ascontiguousarray(hidden, dtype=np.float32),
            "c0_embed": np.asarray(self.embeddings.codec(list(c0)), dtype=np.float32).reshape(len(c0), -1),
            "temperature": np.array([0.0 if g else s.temperature for g, s in zip(greedy, samplings)], np.float32),
            "top_k": np.array([1 if g else s.top_k for g, s in zip(greedy, samplings)], np.int64),
            "top_p": np.array([s.top_p for s in samplings], np.float32),
            "repetition_penalty": np.array([s.repetition_penalty for s in samplings], np.float32),
            "uniforms": np.ascontiguousarray(uniforms, dtype=np.float32),
        }
        codes, total = self.session.run(["codes", "embedding_sum"], feed)
        return codes.astype(np.int64, copy=False), total
