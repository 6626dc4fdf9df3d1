"""kztts.server.scheduler: one thread runs every request through one engine. Jobs join free rows at the next step
and leave at their end; the queue limit (429) and the drain (503) refuse new ones; a client that leaves frees its
row; an engine's refusal ends one job with a 400, a bug the jobs it touched with a 500, and the thread goes on.
Driven here through an engine that counts (the real engines: tests/server/test_speech.py, test_chat.py)."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from kztts.core.errors import KzttsError
from kztts.server.errors import ApiError
from kztts.server.metrics import Metrics
from kztts.server.scheduler import Job, Scheduler


class CountingEngine:
    """``Engine``: a job's spec is how many units it makes; each step emits one ("text", "<id>:<k>") per running
    job. ``refuse`` (a spec) makes ``start`` refuse it; ``bug_at`` (a step number) makes that step raise."""

    unit = "tokens"
    mode = "a counting engine"

    def __init__(self, capacity: int, refuse=None, bug_at=None):
        self.capacity, self.refuse, self.bug_at = capacity, refuse, bug_at
        self.running: list[Job] = []
        self.started, self.dropped, self.resets, self.steps = [], [], 0, 0
        self.widest = 0  # the most jobs that ran in one step

    def start(self, job: Job) -> None:
        if job.spec == self.refuse:
            raise KzttsError(f"cannot start {job.spec}")
        job.state = 0
        self.started.append(job.id)
        self.running.append(job)

    def step(self) -> int:
        self.steps += 1
        if self.steps == self.bug_at:
            raise RuntimeError("a bug in the engine")
        made = len(self.running)
        self.widest = max(self.widest, made)
        for job in list(self.running):
            job.state += 1
            job.emit("text", f"{job.id}:{job.state}")
            if job.state == job.spec:
                job.emit("done", {"units": job.state})
                self.running.remove(job)
        time.sleep(0.002)  # a step takes time: submissions meanwhile wait for a row
        return made

    def drop(self, job: Job) -> None:
        self.dropped.append(job.id)
        self.running.remove(job)

    def reset(self) -> None:
        self.resets += 1
        self.running = []


async def events_of(job: Job, timeout: float = 10) -> list:
    """The job's events up to its end (done or error)."""
    out = []
    while True:
        kind, value = await asyncio.wait_for(job.events.get(), timeout)
        out.append((kind, value))
        if kind in ("done", "error"):
            return out


def run(coroutine_fn, engine: CountingEngine, queue: int = 8):
    """``coroutine_fn(scheduler, loop)`` on an event loop, the scheduler's thread running meanwhile."""
    scheduler = Scheduler(engine, queue, Metrics())

    async def main():
        scheduler.start()
        try:
            return await coroutine_fn(scheduler, asyncio.get_running_loop())
        finally:
            scheduler.stop()

    return asyncio.run(main()), scheduler


def test_jobs_share_the_rows_and_each_gets_its_own_events():
    engine = CountingEngine(capacity=2)

    async def go(scheduler, loop):
        jobs = [Job("chat", n, loop) for n in (3, 5, 2)]
        for job in jobs:
            scheduler.submit(job)
        return jobs, [await events_of(job) for job in jobs]

    (jobs, events), scheduler = run(go, engine)
    for job, got in zip(jobs, events):
        assert got == [("text", f"{job.id}:{k}") for k in range(1, job.spec + 1)] + [("done", {"units": job.spec})]
        assert job.finished and job.first_output is not None and job.first_output >= 0
    assert engine.widest == 2 and engine.started == [j.id for j in jobs]  # the third waited for a free row
    assert scheduler.counts() == (0, 0) and scheduler.idle
    assert scheduler.metrics.registry.get_sample_value("kztts_tokens_total") == 3 + 5 + 2
    assert not scheduler.alive  # stopped


def test_the_queue_limit_and_the_drain_refuse_new_jobs():
    engine = CountingEngine(capacity=1)

    async def go(scheduler, loop):
        first, waiting = Job("chat", 400, loop), Job("chat", 1, loop)
        scheduler.submit(first)
        await asyncio.wait_for(first.events.get(), 10)  # running: the only row is taken
        scheduler.submit(waiting)  # the one place in the queue
        with pytest.raises(ApiError) as full:
            scheduler.submit(Job("chat", 1, loop))
        assert scheduler.counts() == (1, 1)
        scheduler.drain()
        with pytest.raises(ApiError) as draining:
            scheduler.submit(Job("chat", 1, loop))
        first.cancel()
        return full.value, draining.value, await events_of(waiting)

    (full, draining, waited), scheduler = run(go, engine, queue=1)
    assert (full.status, full.code, full.headers["Retry-After"]) == (429, "queue_full", "2")
    assert "1 requests running and 1 waiting (--queue 1)" in full.message
    assert (draining.status, draining.code, draining.headers) == (503, "draining", {"Retry-After": "5",
                                                                                   "Connection": "close"})
    assert waited[-1] == ("done", {"units": 1})  # accepted before the drain: it runs to its end


def test_a_client_that_leaves_frees_its_row_or_its_place():
    engine = CountingEngine(capacity=1)

    async def go(scheduler, loop):
        running, waiting, after = Job("chat", 10_000, loop), Job("chat", 5, loop), Job("chat", 2, loop)
        scheduler.submit(running)
        await asyncio.wait_for(running.events.get(), 10)
        scheduler.submit(waiting)
        waiting.cancel()  # leaves while waiting
        running.cancel()  # leaves mid-run
        scheduler.submit(after)
        return running, waiting, await events_of(after)

    (running, waiting, after), scheduler = run(go, engine)
    assert engine.dropped == [running.id] and waiting.id not in engine.started
    assert after[-1] == ("done", {"units": 2}) and running.state < 10_000
    assert scheduler.metrics.registry.get_sample_value("kztts_cancelled_total") == 2


def test_a_refused_start_ends_that_job_with_a_400_and_the_others_run():
    engine = CountingEngine(capacity=2, refuse=7)

    async def go(scheduler, loop):
        bad, good = Job("chat", 7, loop), Job("chat", 2, loop)
        scheduler.submit(bad)
        scheduler.submit(good)
        return await events_of(bad), await events_of(good)

    (bad, good), _ = run(go, engine)
    (kind, error), = bad
    assert kind == "error" and (error.status, error.code, error.message) == (400, "invalid_value", "cannot start 7")
    assert good[-1] == ("done", {"units": 2})


def test_a_bug_ends_the_jobs_it_touched_with_a_500_and_the_thread_goes_on(caplog):
    engine = CountingEngine(capacity=2, bug_at=2)

    async def go(scheduler, loop):
        touched = [Job("chat", 5, loop), Job("chat", 5, loop)]
        for job in touched:
            scheduler.submit(job)
        ended = [await events_of(job) for job in touched]
        later = Job("chat", 1, loop)
        scheduler.submit(later)
        return ended, await events_of(later)

    with caplog.at_level(logging.ERROR, logger="kztts.server.scheduler"):
        (ended, later), scheduler = run(go, engine)
    for events in ended:
        kind, error = events[-1]
        assert kind == "error" and (error.status, error.code) == (500, "internal_error")
    assert engine.resets == 1 and later[-1] == ("done", {"units": 1})
    assert any("bug in the scheduler while stepping the batch" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_job_emits_to_its_loop_from_any_thread_and_not_after_it_closed():
    loop = asyncio.new_event_loop()
    job = Job("speech", None, loop)
    job.emit("text", "a")
    loop.run_until_complete(asyncio.sleep(0))  # the loop runs the queued put
    assert job.events.get_nowait() == ("text", "a") and job.first_output is not None and not job.finished
    job.fail(ApiError(400, "no"))
    loop.run_until_complete(asyncio.sleep(0))
    assert job.events.get_nowait()[0] == "error" and job.finished
    job.cancel()
    assert not job.cancelled  # a finished job has nothing to cancel
    loop.close()
    Job("speech", None, loop).emit("done", {})  # nobody listens any more: dropped, no error
