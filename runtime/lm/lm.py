"""``kztts.LM``: text generation and chat over an LM bundle (``kztts export`` of a Qwen2/Qwen3 causal LM, or of a hybrid
Qwen3-Next / Qwen3.5 one, whose runners keep the DeltaNet layers' states beside the KV: ``kztts.runners.hybrid``).

numpy + onnxruntime only. The bundle's graphs are the Talker's kinds over the LM's decoder
stack, so the Talker runners run it (opened through ``kztts.plan.resolve``: the CPU, the static HTP
graphs, the handover or per-layer placements): the host gathers token embeddings from the
``token_embedding`` table, the runner returns the last position's logits, and the TTS sampler
(``kztts.generation.sampling.choose``: repetition penalty over the conversation's ids, temperature,
top-k, top-p, a seeded ``XorShift32`` draw; greedy = argmax) picks the next token.

``generate(prompt)`` streams text pieces for one prompt (prefilled fresh). ``chat_session()``
keeps one conversation in the runner's KV cache: each ``send(text)`` feeds only the new turn
(``kztts.lm.chatml``: the previous reply's end, the user block, the generation prompt) and streams
the reply; nothing is prefilled twice. The LM has one KV cache, so one conversation (or
generation) is live at a time: starting another ends the previous session.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from kztts.bundle.bundle import TOKENIZER_FILE, Bundle
from kztts.bundle.embeddings import bf16_to_f32
from kztts.bundle.manifest import KIND_LM
from kztts.core.errors import BundleError, ContextOverflowError, KzttsError
from kztts.generation.sampling import ChainInputs, SamplingParams, XorShift32, choose
from kztts.htp.targets import Target
from kztts.lm import chatml
from kztts.plan.resolve import resolve_plan, warn_unvalidated

log = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 256
TOKEN_EMBEDDING = "token_embedding"
# transformers' GenerationConfig defaults, for a checkpoint without generation_config.json
_HF_DEFAULTS = dict(do_sample=False, temperature=1.0, top_k=50, top_p=1.0, repetition_penalty=1.0)


def default_params(generation: dict) -> SamplingParams:
    """The checkpoint's sampling settings (its generation_config), as ``kztts.generation.sampling`` params."""
    g = {**_HF_DEFAULTS, **{k: v for k, v in generation.items() if k in _HF_DEFAULTS}}
    return SamplingParams(float(g["temperature"]), int(g["top_k"]), float(g["top_p"]),
                          float(g["repetition_penalty"]), greedy=not g["do_sample"]).validate()


@dataclass
class Reply:
    """What one generation produced: token ids (the stop token excluded), their text, and why it ended.
    ``logits`` holds the scores each token was chosen from when the call asked for them."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    stopped_by: str = ""  # "stop" (eos / <|im_end|>) or "max_new_tokens"
    logits: list[np.ndarray] = field(default_factory=list)


class LM:
    """An LM bundle, ready to generate. ``target``/``placement``/``strict`` choose where the
    stack runs (as for ``kztts.tts.tts.TTS``; HTP layer graphs' fp16 probes are checked, ``kztts.htp.saturation``);
    ``context`` caps the CPU KV cache (positions); ``talker``: a runner to use instead of the plan's
    (calibration passes its per-layer runner); ``check_saturation`` False runs a placement's whole
    static graphs even when the bundle has the probed layer graphs (as validation does)."""

    def __init__(self, bundle, *, target: "str | Path | Target | None" = None, placement=None, strict: bool = False,
                 context: int | None = None, session_config=None, attention: str | None = None, talker=None,
                 check_saturation: bool = True):
        from tokenizers import Tokenizer

        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, session_config,
                                                                            load_graphs=False)
        m = self.bundle.manifest
        if m.kind != KIND_LM:
            raise BundleError(f"{m.path}: a {m.kind} bundle, not a causal LM; export a Qwen2/Qwen3/Qwen3-Next LM "
                              "(kztts export LM_DIR -o BUNDLE, or --gguf FILE)")
        self.plan = resolve_plan(self.bundle, target=target, placement=placement, strict=strict,
                                 attention=attention, check_saturation=check_saturation)
        warn_unvalidated(self.plan)
        try:
            self.runner = talker if talker is not None else self.plan.open_talker(context)
        except BaseException:
            self.plan.close()  # HTP host processes started for the graphs opened so far
            raise
        self.tokenizer = Tokenizer.from_file(str(Path(self.bundle.path) / TOKENIZER_FILE))
        spec = m.embeddings.get(TOKEN_EMBEDDING)
        if spec is None:
            raise BundleError(f"{m.path}: no {TOKEN_EMBEDDING} table; re-export the bundle")
        self._table = self.bundle.table(TOKEN_EMBEDDING)
        self._bf16 = spec["dtype"] == "bf16"
        self.stop_ids = frozenset(int(i) for i in m.special_ids.get("stop", ()))
        chat = m.data["chat"]
        self.default_system = chat.get("default_system")
        self.params = default_params(m.generation)
        self.history: list[int] = []  # every id in the KV cache, in order
        self._owner: object | None = None

    # ------------------------------------------------------------ tokens
    @property
    def context(self) -> int:
        """Positions the KV cache holds."""
        return int(self.runner.context)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        rows = np.asarray(self._table[np.asarray(ids, dtype=np.int64)])
        return bf16_to_f32(rows) if self._bf16 else rows.astype(np.float32, copy=False)

    # ------------------------------------------------------------ the cache
    def _claim(self, owner: object) -> None:
        """Give the KV cache to ``owner`` (a new generation or chat session), from an empty cache."""
        self._owner = owner
        self.runner.reset()
        self.history = []

    def _check_owner(self, owner: object) -> None:
        if self._owner is not owner:
            raise KzttsError("this chat session or generation has ended: the LM started another one since (one KV "
                             "cache per LM); start a new one, or use one LM per conversation")

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` to the cache; the logits [vocab] after the last of them."""
        ids = [int(i) for i in ids]
        if not ids:
            raise KzttsError("nothing to feed: the token list is empty")
        used = len(self.history)
        if used + len(ids) > self.context:
            raise ContextOverflowError(
                f"context overflow: {used} positions used + {len(ids)} new > the LM's context of {self.context} "
                "positions; start a new chat session (or shorten the prompt, lower max_new_tokens, or open the "
                "LM with a larger context=, up to the model's max positions / the HTP graphs' static context)")
        x = self.embed(ids)
        logits, _ = self.runner.prefill(x) if used == 0 else self.runner.extend(x)
        self.history += ids
        return np.asarray(logits, dtype=np.float32)

    # ------------------------------------------------------------ generation
    def _params(self, params: SamplingParams | None, greedy: bool) -> SamplingParams:
        """``greedy``: argmax after the processors, so the repetition penalty stays (as transformers'
        greedy search with the checkpoint's generation config, and ``kztts synth --greedy``)."""
        p = (params or self.params).validate()
        return replace(p, greedy=True) if greedy else p

    def tokens(self, logits: np.ndarray, max_new_tokens: int, params: SamplingParams, seed: int,
               reply: Reply, keep_logits: bool = False, owner: object = None) -> Iterator[int]:
        """Sample up to ``max_new_tokens`` ids after ``logits`` (the cache's last position), feeding each
        one back except a stop id and the last; yields every id (a stop id too) and fills ``reply``.
        ``owner``: the generation or session the cache must still belong to at each step."""
        if max_new_tokens < 1:
            raise KzttsError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        rng = XorShift32(seed)
        for step in range(max_new_tokens):
            if keep_logits:
                reply.logits.append(logits)
            token = choose("talker", logits, params, ChainInputs(u=rng.uniform(), history=self.history))
            yield token
            if token in self.stop_ids:
                reply.stopped_by = "stop"
                return
            reply.ids.append(token)
            if step + 1 == max_new_tokens:
                reply.stopped_by = "max_new_tokens"
                return
            if len(self.history) + 1 > self.context:
                raise ContextOverflowError(
                    f"context overflow after {len(reply.ids)} generated tokens: the LM's context of {self.context} "
                    "positions is full; start a new chat session, lower max_new_tokens, or open the LM with a "
                    "larger context=")
            if owner is not None:
                self._check_owner(owner)
            logits = self.feed([token])

    def stream_text(self, logits: np.ndarray, max_new_tokens: int, params: SamplingParams, seed: int,
                    reply: Reply, keep_logits: bool = False, owner: object = None) -> Iterator[str]:
        """``tokens`` as text pieces: each yield is what the new ids add to the decoded reply (a piece
        ending inside a multi-byte character waits for the next id)."""
        shown = ""
        for _ in self.tokens(logits, max_new_tokens, params, seed, reply, keep_logits, owner):
            text = self.decode(reply.ids)
            if text.endswith("\ufffd"):
                continue
            if len(text) > len(shown) and text.startswith(shown):
                yield text[len(shown):]
            shown = text
        reply.text = self.decode(reply.ids)
        if len(reply.text) > len(shown) and reply.text.startswith(shown):
            yield reply.text[len(shown):]

    def generate(self, prompt: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, *,
                 params: SamplingParams | None = None, seed: int = 0, greedy: bool = False,
                 reply: Reply | None = None) -> Iterator[str]:
        """Stream the continuation of ``prompt`` (raw text, no chat format) as text pieces.
        ``reply`` (if given) receives the ids, text and stop reason."""
        if not isinstance(prompt, str) or not prompt:
            raise KzttsError("the prompt is empty; give some text to continue")
        p = self._params(params, greedy)
        ids = self.encode(prompt)
        owner = object()
        self._claim(owner)
        return self.stream_text(self.feed(ids), max_new_tokens, p, seed, reply if reply is not None else Reply(),
                                owner=owner)

    def chat_session(self, system: str | None = None) -> "ChatSession":
        """A new conversation (the previous one, if any, ends). ``system`` None: the checkpoint's
        default system prompt (its chat template's), if it has one."""
        return ChatSession(self, self.default_system if system is None else system)


class ChatSession:
    """One conversation kept in the LM's KV cache. ``send(text)`` streams the reply."""

    def __init__(self, lm: LM, system: str | None):
        self.lm = lm
        self.system = system
        self.messages: list[dict] = [] if system is None else [{"role": "system", "content": system}]
        self.replies: list[Reply] = []
        self._live: Iterator[str] | None = None  # the last reply's stream, until it is exhausted
        lm._claim(self)

    def prompt_text(self, user: str) -> str:
        """The ChatML this session feeds for the next user message."""
        first = not any(m["role"] == "user" for m in self.messages)
        return chatml.first_turn(self.system, user) if first else chatml.next_turn(user)

    def send(self, text: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, *, params: SamplingParams | None = None,
             seed: int = 0, greedy: bool = False, keep_logits: bool = False) -> Iterator[str]:
        """Stream the assistant's reply to ``text``; afterwards ``replies[-1]`` holds it (and the logits
        with ``keep_logits``) and ``messages`` the conversation."""
        self.lm._check_owner(self)
        if not isinstance(text, str) or not text.strip():
            raise KzttsError("the message is empty; type something to send")
        if self._live is not None:  # the previous reply was not read to its end: finish it first
            for _ in self._live:
                pass
        p = self.lm._params(params, greedy)
        ids = self.lm.encode(self.prompt_text(text))
        pending = self.replies[-1].ids[-1:] if self.replies and self.replies[-1].stopped_by == "max_new_tokens" \
            else []  # a reply cut by max_new_tokens: its last token was never fed
        logits = self.lm.feed(pending + ids)
        self.messages.append({"role": "user", "content": text})
        reply = Reply()
        self.replies.append(reply)

        def stream() -> Iterator[str]:
            yield from self.lm.stream_text(logits, max_new_tokens, p, seed, reply, keep_logits, owner=self)
            self.messages.append({"role": "assistant", "content": reply.text})
            self._live = None

        self._live = stream()
        return self._live
