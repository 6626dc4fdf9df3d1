"""Chat engines: requests of ``POST /v1/chat/completions`` through an LM bundle's graphs.

A request is stateless (OpenAI's API): its messages render as ChatML (``kztts.lm.chatml.render``, the
checkpoint's default system prompt when it gives none), are prefilled into a row, and the reply is
sampled as ``LM.generate`` samples it (``kztts.generation.sampling.choose("talker")``: the repetition
penalty over every id in the row's cache, a ``XorShift32`` of the request's seed, greedy = argmax), so
each reply equals ``LM.generate(render(messages))`` alone.

``BatchedChat`` runs the rows together over ``talker_batched`` (the Talker's batched graph over the LM's
stack: per-row KV lengths, rows never mix, ``kztts.runners.batched.BatchedTalker``): a request joins at
the next token and leaves at its stop token or ``max_tokens``. ``SerialChat`` serves an LM bundle
without that graph (exported before it, a head_dim the fused CPU attention does not take) or a plan that
runs other graphs (``--target``/``--placement``), one request at a time through ``LM.generate``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np

from kztts.assistant.spoken_reply import SpeakSettings
from kztts.core.errors import KzttsError
from kztts.generation.sampling import ChainInputs, SamplingParams, XorShift32, choose
from kztts.lm import chatml
from kztts.lm.lm import LM, Reply
from kztts.runners.batched import BatchedTalker
from kztts.server.scheduler import Job

log = logging.getLogger(__name__)

BATCHED_GRAPH = "talker_batched"
FIRST_CAPACITY = 512  # KV positions per row to start with; the rows grow when a request needs more


@dataclass
class ChatSpec:
    """What a chat job runs: its prompt ids, reply budget, sampling and seed."""

    prompt: str  # the ChatML text (``prompt_of``)
    ids: list[int]  # its token ids
    max_tokens: int
    params: SamplingParams
    seed: int
    speak: "SpeakSettings | None" = None  # a spoken reply (kztts.server.spoken_chat)


@dataclass
class _Row:
    """A reply in progress."""

    spec: ChatSpec
    rng: XorShift32
    logits: np.ndarray
    history: list[int]  # every id in the row's cache, in order (the repetition penalty reads them)
    reply: list[int] = field(default_factory=list)
    sampled: int = 0
    shown: str = ""


def prompt_of(lm: LM, messages: list[dict]) -> str:
    """The ChatML text a conversation is prefilled from (with the checkpoint's default system prompt)."""
    return chatml.render(messages, add_generation_prompt=True, default_system=lm.default_system)


def params_of(lm: LM, temperature: float | None, top_p: float | None, top_k: int | None,
              repetition_penalty: float | None, greedy: bool) -> SamplingParams:
    """The checkpoint's sampling settings with the request's values; temperature 0 is greedy."""
    p = lm.params
    values = {k: v for k, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                                ("repetition_penalty", repetition_penalty)) if v is not None}
    p = replace(p, **values)
    if greedy or temperature == 0:
        p = replace(p, greedy=True)
    elif temperature is not None:
        p = replace(p, greedy=False)  # a temperature asks for sampling, whatever the checkpoint's default
    return p.validate()


def _delta(lm: LM, row: _Row, final: bool) -> str:
    """What the reply's text gained (``LM.stream_text``'s rule: wait while a character is cut)."""
    text = lm.decode(row.reply)
    if not final and text.endswith("\ufffd"):
        return ""
    out = text[len(row.shown):] if len(text) > len(row.shown) and text.startswith(row.shown) else ""
    row.shown = text
    return out


def _done(lm: LM, job: Job, row: _Row, finish: str) -> None:
    tail = _delta(lm, row, final=True)
    if tail:
        job.emit("text", tail)
    job.emit("done", {"text": lm.decode(row.reply), "finish_reason": finish, "prompt_tokens": len(row.spec.ids),
                      "completion_tokens": row.sampled})


class BatchedChat:
    """Conversations in the rows of ``talker_batched`` (``Engine``)."""

    unit = "tokens"

    def __init__(self, lm: LM, rows: int):
        why = batched_refusal(lm)
        if why:
            raise KzttsError(why)
        self.lm = lm
        self.capacity = rows
        self.running: list[Job] = []
        self.context = lm.context  # a row holds what the LM alone holds
        self.stops = lm.stop_ids
        self._session = lm.plan.session(BATCHED_GRAPH)
        self.talker = self._talker(min(FIRST_CAPACITY, self.context))
        self.mode = f"continuous batching: up to {rows} conversations share each token ({BATCHED_GRAPH})"

    def _talker(self, capacity: int) -> BatchedTalker:
        return BatchedTalker(self._session, self.lm.bundle.manifest.talker, self.capacity, capacity)

    def _grow(self, capacity: int) -> None:
        old, new = self.talker, self._talker(capacity)
        for row in range(len(self.running)):
            n = int(old.lengths[row])
            for dst, src in zip((*new.keys, *new.values), (*old.keys, *old.values)):
                dst[row, :, :n] = src[row, :, :n]
            new.lengths[row] = n
        self.talker = new

    def start(self, job: Job) -> None:
        spec: ChatSpec = job.spec
        need = len(spec.ids) + spec.max_tokens - 1
        if need > self.talker.capacity:
            self._grow(max(need, min(2 * self.talker.capacity, self.context)))
        logits, _ = self.talker.prefill(len(self.running), self.lm.embed(spec.ids))
        job.state = _Row(spec, XorShift32(spec.seed), logits, list(spec.ids))
        self.running.append(job)

    def step(self) -> int:
        lm, feeding, tokens = self.lm, [], []
        for k, job in enumerate(self.running):
            row: _Row = job.state
            token = choose("talker", row.logits, row.spec.params, ChainInputs(u=row.rng.uniform(), history=row.history))
            row.sampled += 1
            if token in self.stops:
                _done(lm, job, row, "stop")
                continue
            row.reply.append(token)
            text = _delta(lm, row, final=False)
            if text:
                job.emit("text", text)
            if len(row.reply) == row.spec.max_tokens:
                _done(lm, job, row, "length")
                continue
            feeding.append(k)
            tokens.append(token)
        made = len(self.running)
        self.talker.keep(feeding)
        self.running = [self.running[k] for k in feeding]
        if self.running:
            logits, _ = self.talker.decode(lm.embed(tokens))
            for k, job in enumerate(self.running):
                job.state.logits = logits[k]
                job.state.history.append(tokens[k])
        return made

    def drop(self, job: Job) -> None:
        k = self.running.index(job)
        self.talker.keep([i for i in range(len(self.running)) if i != k])
        self.running.pop(k)

    def reset(self) -> None:
        self.running = []
        self.talker = self._talker(min(FIRST_CAPACITY, self.context))


class SerialChat:
    """One conversation at a time through ``LM.generate`` (``Engine``)."""

    unit = "tokens"
    capacity = 1

    def __init__(self, lm: LM, why: str):
        self.lm = lm
        self.context = lm.context
        self.running: list[Job] = []
        self._pieces: Iterator[str] | None = None
        self._reply: Reply | None = None
        self.mode = f"one conversation at a time, in arrival order ({why})"

    def start(self, job: Job) -> None:
        spec: ChatSpec = job.spec
        self._reply = Reply()
        self._pieces = self.lm.generate(spec.prompt, spec.max_tokens,
                                        params=spec.params, seed=spec.seed, reply=self._reply)
        self.running = [job]

    def step(self) -> int:
        job = self.running[0]
        before = len(self._reply.ids)
        try:
            piece = next(self._pieces)
        except StopIteration:
            reply = self._reply
            sampled = len(reply.ids) + (reply.stopped_by == "stop")
            job.emit("done", {"text": reply.text, "finish_reason": "stop" if reply.stopped_by == "stop" else "length",
                              "prompt_tokens": len(job.spec.ids), "completion_tokens": sampled})
            self.running, self._pieces = [], None
            return 0
        job.emit("text", piece)
        return max(1, len(self._reply.ids) - before)

    def drop(self, job: Job) -> None:
        if self._pieces is not None:
            self._pieces.close()
        self.running, self._pieces = [], None

    def reset(self) -> None:
        self.drop(None)


def batched_refusal(lm: LM) -> str | None:
    """Why ``lm`` cannot batch conversations, or None."""
    m = lm.bundle.manifest
    if BATCHED_GRAPH not in m.graphs:
        return (f"the bundle has no {BATCHED_GRAPH} graph (exported before LM bundles carried it, or its head_dim "
                f"{m.talker.get('head_dim')} is not a multiple of 16, which ONNX Runtime's fused CPU attention "
                "needs); re-export it with a current kztts to batch")
    used = lm.plan.steps["talker_decode"].graphs[0]
    if lm.plan.runner != "cpu" or used != "talker_gqa":
        return (f"the plan runs {used} (runner {lm.plan.runner}); batching runs the fused CPU graphs: serve "
                "without --target/--placement, with KZTTS_ATTENTION=fused")
    return None


def open_chat_engine(lm: LM, batch: int):
    """``BatchedChat`` when the bundle and plan allow it, else ``SerialChat`` (the reason in its ``mode``)."""
    why = batched_refusal(lm)
    return SerialChat(lm, why) if why else BatchedChat(lm, batch)
