"""The Code Predictor runner: one frame's codes c1..c15 from the talker hidden and c0.

Two modes over the bundle's graphs (see kztts.export.graphs.code_predictor_graph):

- ``"frame"`` (default): one ``cp_frame`` run per frame; the graph holds all 15 steps
  and samples in-graph with the same chain as ``kztts.generation.sampling``.
- ``"step"``: 15 ``cp_step`` runs with the KV cache on the host and the host sampler.

Random numbers: every ``predict`` call takes exactly 15 uniforms from ``rng`` up front,
whatever the mode and even when greedy, so a generator's stream stays aligned across
modes and sampling settings; both modes draw step g's code with uniform g.
Sampling parameters are validated before any graph runs.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from kztts.bundle.graphs import DYNAMIC_KV
from kztts.core.errors import BundleError, KzttsError
from kztts.generation.sampling import ChainInputs, SamplingParams, XorShift32, choose
from kztts.runners.kv_cache import KVCache, kv_dtype
from kztts.runners.rope import rope_tables

MODES = ("frame", "step")
STEP_GRAPH = "cp_step"
FRAME_GRAPH = "cp_frame"
FUSED_FRAME_GRAPH = "cp_frame_gqa"  # cp_frame over ONNX Runtime's fused attention (CPU only)


class CodecLookup(Protocol):
    """What the Code Predictor needs from the embedding tables (``kztts.bundle.embeddings.EmbeddingTables``)."""

    def codec(self, ids) -> np.ndarray:  # C(ids), f32 [n, H]
        ...

    def cp_codec(self, group_index: int, ids) -> np.ndarray:  # cp.codec_embedding[group_index](ids), f32 [n, H]
        ...


class CodePredictor:
    """``predict(hidden, c0, sampling, rng) -> (codes int64 [15], embedding_sum f32 [H])``.

    ``sessions``: a mapping or callable giving the ONNX Runtime session for "cp_step" /
    ``frame_graph`` ("cp_frame", or "cp_frame_gqa" with the same I/O; only the one the
    mode needs is opened); ``config``: the manifest's
    ``config.code_predictor``; ``talker_config``: ``config.talker``; ``embeddings``: a
    ``CodecLookup``. ``embedding_sum`` = sum_{g=1..15} cp_codec[g-1](c_g); the next talker
    input is ``C(c0) + embedding_sum + text``.
    """

    def __init__(self, sessions, config: dict, talker_config: dict, embeddings: CodecLookup, mode: str = "frame",
                 frame_graph: str = FRAME_GRAPH):
        if mode not in MODES:
            raise KzttsError(f"code predictor mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.frame_graph = frame_graph
        self._sessions = sessions
        self.embeddings = embeddings
        try:
            self.num_layers = int(config["num_layers"])
            self.num_kv_heads = int(config["num_kv_heads"])
            self.head_dim = int(config["head_dim"])
            self.rope_theta = float(config["rope_theta"])
            self.vocab = int(config["vocab"])
            self.num_groups = int(config["num_code_groups"]) - 1
            self.hidden_size = int(talker_config["hidden"])
            self.talker_vocab = int(talker_config["vocab"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"code predictor / talker config lacks or mangles {exc}; re-export the bundle") from exc
        positions = self.num_groups + 1  # [h, C(c0)] then c1..c14
        self._cos, self._sin = rope_tables(positions, self.head_dim, self.rope_theta)
        self._step_outputs = ["logits"] + DYNAMIC_KV.new_names(self.num_layers)
        self._step_past = DYNAMIC_KV.past_names(self.num_layers)
        session = self.session  # open the mode's graph now: a broken bundle fails here, not mid-generation
        dtype = kv_dtype(session) if mode == "step" else np.float32
        self._kv = KVCache(self.num_layers, self.num_kv_heads, self.head_dim, positions, dtype)

    def _session(self, name: str):
        s = self._sessions
        return s(name) if callable(s) else s[name]

    @property
    def session(self):
        return self._session(self.frame_graph if self.mode == "frame" else STEP_GRAPH)

    # ------------------------------------------------------------------ checks
    def _check(self, hidden, c0, sampling: SamplingParams, rng) -> tuple[np.ndarray, int]:
        if not isinstance(sampling, SamplingParams):
            raise KzttsError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        sampling.validate("code predictor ")
        if not isinstance(rng, XorShift32):
            raise KzttsError(f"rng must be a kztts.generation.sampling.XorShift32, got {type(rng).__name__}")
        h = np.asarray(hidden, dtype=np.float32)
        if h.shape != (self.hidden_size,):
            raise KzttsError(f"code predictor expects the talker hidden [{self.hidden_size}], got {h.shape}")
        if isinstance(c0, bool) or not isinstance(c0, (int, np.integer)) or not 0 <= int(c0) < self.talker_vocab:
            raise KzttsError(f"c0 must be a codec id in 0..{self.talker_vocab - 1}, got {c0!r}")
        return h, int(c0)

    # ------------------------------------------------------------------ predict
    def predict(self, hidden, c0: int, sampling: SamplingParams, rng: XorShift32) -> tuple[np.ndarray, np.ndarray]:
        """Codes c1..c15 (int64 [15]) and their embedding sum (f32 [H]) for one frame."""
        h, c0 = self._check(hidden, c0, sampling, rng)
        uniforms = rng.uniforms(self.num_groups)
        c0_embed = np.asarray(self.embeddings.codec([c0]), dtype=np.float32).reshape(1, self.hidden_size)
        if self.mode == "frame":
            return self._predict_frame(h, c0_embed, sampling, uniforms)
        return self._predict_step(h, c0_embed, sampling, uniforms)

    def _predict_frame(self, h, c0_embed, sampling: SamplingParams, uniforms):
        greedy = sampling.is_greedy
        feed = {
            "hidden": h[None],
            "c0_embed": c0_embed,
            "temperature": np.array([0.0 if greedy else sampling.temperature], dtype=np.float32),
            "top_k": np.array([1 if greedy else sampling.top_k], dtype=np.int64),
            "top_p": np.array([sampling.top_p], dtype=np.float32),
            "repetition_penalty": np.array([sampling.repetition_penalty], dtype=np.float32),
            "uniforms": uniforms,
        }
        codes, total = self.session.run(["codes", "embedding_sum"], feed)
        return codes.astype(np.int64, copy=False), total[0]

    def _step(self, embeds: np.ndarray, group: int) -> np.ndarray:
        """Run ``cp_step`` on [T, H] embeddings with head ``group``; append the KV; return logits [V]."""
        t, p = embeds.shape[0], self._kv.length
        self._kv.check_room(t)
        feed = {
            "inputs_embeds": np.ascontiguousarray(embeds, dtype=np.float32)[None],
            "rope_cos": self._cos[None, p:p + t],
            "rope_sin": self._sin[None, p:p + t],
            "step": np.array([group], dtype=np.int64),
        }
        for i in range(self.num_layers):
            feed[self._step_past[2 * i]], feed[self._step_past[2 * i + 1]] = self._kv.past(i)
        out = self.session.run(self._step_outputs, feed)
        self._kv.append(out[1::2], out[2::2])
        return out[0][0]

    def _predict_step(self, h, c0_embed, sampling: SamplingParams, uniforms):
        self._kv.reset()
        x = np.concatenate([h[None], c0_embed], axis=0)
        codes = np.zeros(self.num_groups, dtype=np.int64)
        total = None
        for g in range(self.num_groups):
            logits = self._step(x, g)
            codes[g] = choose("code_predictor", logits, sampling, ChainInputs(u=float(uniforms[g]), history=codes[:g]))
            e = np.asarray(self.embeddings.cp_codec(g, codes[g:g + 1]), dtype=np.float32)  # [1, H]
            total = e[0] if total is None else total + e[0]
            x = e
        return codes, total

    def teacher_forced_logits(self, hidden, c0: int, codes) -> np.ndarray:
        """Step-graph logits [15, V] of every head with the given codes c1..c14 fed back (validation)."""
        if self.mode != "step":
            raise KzttsError("teacher_forced_logits needs the code predictor in 'step' mode")
        h, c0 = self._check(hidden, c0, SamplingParams.greedy_params(), XorShift32(1))
        codes = np.asarray(codes, dtype=np.int64).reshape(-1)
        if codes.size < self.num_groups - 1:
            raise KzttsError(f"teacher forcing needs at least {self.num_groups - 1} codes, got {codes.size}")
        self._kv.reset()
        x = np.concatenate([h[None], np.asarray(self.embeddings.codec([c0]), np.float32).reshape(1, -1)])
        out = []
        for g in range(self.num_groups):
            out.append(self._step(x, g))
            if g + 1 < self.num_groups:
                x = np.asarray(self.embeddings.cp_codec(g, codes[g:g + 1]), dtype=np.float32)
        return np.stack(out)
