"""kztts.server.chat: the chat engines driven as the scheduler drives them (start, step, drop), without HTTP. A
conversation's prompt is its ChatML with the checkpoint's default system prompt, its sampling the checkpoint's
with the request's values; ``BatchedChat`` gives every reply (greedy or sampled, joining late, in rows that grow)
what ``LM.generate`` gives it alone, and so does ``SerialChat``; ``open_chat_engine`` picks one (over HTTP:
tests/server/test_serve.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kztts.core.errors import KzttsError
from kztts.lm import chatml
from kztts.lm.lm import Reply
from kztts.server import chat as server_chat
from kztts.server.chat import BatchedChat, ChatSpec, SerialChat, batched_refusal, open_chat_engine, params_of, prompt_of
from kztts.server.scheduler import Job

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bonjour ?"},
     {"role": "assistant", "content": "Salut."}, {"role": "user", "content": "你好"}],
    [{"role": "user", "content": "def add(a, b):"}],
]


class AtOnce:
    """The handler's event loop, stood in for: a job's event goes into its queue at once."""

    @staticmethod
    def call_soon_threadsafe(put, *args):
        put(*args)


def spec(lm, messages, max_tokens: int, *, temperature=None, seed: int = 0) -> ChatSpec:
    prompt = prompt_of(lm, messages)
    return ChatSpec(prompt, lm.encode(prompt), max_tokens, params_of(lm, temperature, None, None, None, False), seed)


def events(job: Job) -> list:
    out = []
    while not job.events.empty():
        out.append(job.events.get_nowait())
    return out


def reply_of(job: Job) -> tuple[str, dict]:
    got = events(job)
    assert all(kind == "text" for kind, _ in got[:-1]) and got[-1][0] == "done", got
    return "".join(text for _, text in got[:-1]), got[-1][1]


def alone(lm, s: ChatSpec) -> tuple[str, dict]:
    reply = Reply()
    text = "".join(lm.generate(s.prompt, s.max_tokens, params=s.params, seed=s.seed, reply=reply))
    stopped = reply.stopped_by == "stop"
    return text, {"text": reply.text, "finish_reason": "stop" if stopped else "length",
                  "prompt_tokens": len(s.ids), "completion_tokens": len(reply.ids) + stopped}


def run(engine, first: list[Job], late: list[Job] = (), after: int = 4) -> None:
    for job in first:
        engine.start(job)
    waiting, steps = list(late), 0
    while engine.running or waiting:
        if steps >= after:
            while waiting and len(engine.running) < engine.capacity:
                engine.start(waiting.pop(0))
        engine.step()
        steps += 1


def test_the_prompt_is_chatml_with_the_checkpoints_default_system(lm):
    assert prompt_of(lm, CONVERSATIONS[0]) == chatml.render(CONVERSATIONS[0], default_system=lm.default_system)
    assert prompt_of(lm, CONVERSATIONS[1]).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_sampling_is_the_checkpoints_with_the_requests_values(lm):
    assert params_of(lm, None, None, None, None, False) == lm.params.validate()
    assert params_of(lm, 0, None, None, None, False).greedy  # temperature 0 is greedy
    assert params_of(lm, None, None, None, None, True).greedy
    sampled = params_of(lm, 0.7, 0.9, 20, 1.2, False)
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.repetition_penalty, sampled.greedy) == \
        (0.7, 0.9, 20, 1.2, False)
    with pytest.raises(KzttsError, match="top_k"):
        params_of(lm, None, None, -3, None, False)


def test_batched_rows_give_each_reply_what_lm_generate_gives_it_alone(lm, monkeypatch):
    """Two rows that start small (16 positions) and grow; three conversations, greedy and sampled, the third
    joining when a row frees."""
    monkeypatch.setattr(server_chat, "FIRST_CAPACITY", 16)
    engine = BatchedChat(lm, 2)
    assert engine.talker.capacity == 16 and engine.context == lm.context and engine.unit == "tokens"
    specs = [spec(lm, CONVERSATIONS[0], 12), spec(lm, CONVERSATIONS[1], 20, temperature=0.8, seed=5),
             spec(lm, CONVERSATIONS[2], 9, temperature=0)]
    jobs = [Job("chat", s, AtOnce()) for s in specs]
    run(engine, jobs[:2], jobs[2:])
    assert engine.talker.capacity > 16 and engine.running == []
    for job, s in zip(jobs, specs):
        assert reply_of(job) == alone(lm, s)


def test_a_dropped_conversation_leaves_the_others_as_they_were(lm):
    engine = BatchedChat(lm, 2)
    specs = [spec(lm, CONVERSATIONS[0], 10), spec(lm, CONVERSATIONS[2], 10, temperature=0.9, seed=2)]
    leaving, staying = (Job("chat", s, AtOnce()) for s in specs)
    engine.start(leaving)
    engine.start(staying)
    engine.step()
    engine.drop(leaving)
    run(engine, [])
    assert reply_of(staying) == alone(lm, specs[1])
    engine.reset()
    assert engine.running == [] and engine.talker.capacity == min(server_chat.FIRST_CAPACITY, lm.context)


def test_serial_chat_runs_conversations_through_lm_generate(lm):
    engine = SerialChat(lm, "a test")
    assert engine.capacity == 1 and engine.mode == "one conversation at a time, in arrival order (a test)"
    for s in (spec(lm, CONVERSATIONS[1], 14, temperature=0.8, seed=9), spec(lm, CONVERSATIONS[0], 6)):
        job = Job("chat", s, AtOnce())
        run(engine, [job])
        assert reply_of(job) == alone(lm, s)
    job = Job("chat", spec(lm, CONVERSATIONS[0], 6), AtOnce())
    engine.start(job)
    engine.step()
    engine.drop(job)  # the client left
    assert engine.running == [] and [kind for kind, _ in events(job)] == ["text"]


def test_batching_needs_the_batched_graph_and_the_fused_cpu_plan(lm, chat_bundle):
    from kztts.lm.lm import LM

    assert batched_refusal(lm) is None and isinstance(open_chat_engine(lm, 3), BatchedChat)
    plain = LM(chat_bundle, attention="plain")
    why = batched_refusal(plain)
    assert why.startswith("the plan runs talker (runner cpu); batching runs the fused CPU graphs")
    serial = open_chat_engine(plain, 3)
    assert isinstance(serial, SerialChat) and why in serial.mode
    with pytest.raises(KzttsError, match="batching runs the fused CPU graphs"):
        BatchedChat(plain, 2)
    graphs = dict(plain.bundle.manifest.graphs)
    del graphs["talker_batched"]
    older = replace(plain.bundle.manifest, graphs=graphs)
    plain.bundle.manifest = older  # a bundle exported before LM bundles carried the batched graph
    assert batched_refusal(plain).startswith("the bundle has no talker_batched graph")
