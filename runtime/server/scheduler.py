"""The scheduler: one thread owns the graphs and runs every request through one engine.

Requests arrive as ``Job``s from the HTTP handlers (``submit``: refused with 429 when ``queue`` are
already waiting, 503 while draining). The thread loops: drop the jobs whose clients left (their rows are
free at once), admit waiting jobs into free rows (``Engine.start``: a prompt prefilled into its row), then
``Engine.step``: one frame (speech) or token (chat) for every running job. So a request joins at the next
frame and leaves at its end. Output goes back to each job's asyncio queue (``Job.emit``), thread-safely.

An engine error of the user's kind (``KzttsError``) refuses that job with a 400; any other error is a bug:
its traceback is logged, the jobs it touched end with a 500, the engine is reset, and the thread goes on.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from typing import Any, Protocol

from kztts.core.errors import KzttsError
from kztts.server.errors import ApiError
from kztts.server.metrics import Metrics

log = logging.getLogger(__name__)

_ids = itertools.count(1)


class Job:
    """One accepted request: its checked spec, and the asyncio queue its events go to.

    Events: ``("audio", float32 samples)``, ``("text", str)``, ``("done", dict)`` (the end, with a
    summary), ``("error", ApiError)``. ``cancel()`` (the client left) frees its row at the next step."""

    def __init__(self, kind: str, spec: Any, loop: asyncio.AbstractEventLoop):
        self.id = next(_ids)
        self.kind = kind
        self.spec = spec
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.received = time.perf_counter()
        self.first_output: float | None = None  # seconds from received to the first audio or token
        self.cancelled = False
        self.finished = False
        self.state: Any = None  # the engine's per-job state
        self._wake = None

    def emit(self, kind: str, value: Any = None) -> None:
        """Send an event to the handler (from any thread)."""
        if kind in ("audio", "text") and self.first_output is None:
            self.first_output = time.perf_counter() - self.received
        if kind in ("done", "error"):
            self.finished = True
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop has closed: nobody listens any more
            pass

    def fail(self, error: ApiError) -> None:
        self.emit("error", error)

    def cancel(self) -> None:
        """The client left: the scheduler drops the job at its next step."""
        if not self.finished:
            self.cancelled = True
            if self._wake is not None:
                self._wake()


class Engine(Protocol):
    """What the scheduler drives: the graphs, rows and per-job work of one kind of request."""

    capacity: int  # jobs that run together (batch rows; 1 without batched graphs)
    running: list[Job]
    unit: str  # "frames" or "tokens"
    mode: str  # a sentence for the start-up log: how requests are run

    def start(self, job: Job) -> None: ...  # admit a job (prefill its prompt); KzttsError refuses it
    def step(self) -> int | dict[str, int]: ...  # one frame or token for every running job: how many were
    # made (in ``unit``s, or per unit: {"tokens": n, "frames": m} for an engine over two models)
    def drop(self, job: Job) -> None: ...  # a cancelled job leaves its row
    def reset(self) -> None: ...  # after a bug: forget every running job, fresh buffers


class Scheduler:
    """The thread that owns the engine; ``submit`` from the event loop, ``drain`` on SIGTERM."""

    def __init__(self, engine: Engine, queue: int, metrics: Metrics):
        self.engine = engine
        self.queue_limit = int(queue)
        self.metrics = metrics
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self.draining = False
        self._thread = threading.Thread(target=self._loop, name="kztts-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def idle(self) -> bool:
        """Nothing running or waiting."""
        with self._cond:
            return not self._waiting and not self.engine.running and not getattr(self.engine, "pending", 0)

    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self._cond:
            return len(self.engine.running), len(self._waiting)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def submit(self, job: Job) -> None:
        """Queue ``job``, or refuse it: 503 while draining, 429 when the queue is full."""
        with self._cond:
            if self.draining or self._stop:
                raise ApiError(503, "the server is shutting down; retry on another instance or later",
                               code="draining", headers={"Retry-After": "5", "Connection": "close"})
            free = self.engine.capacity - len(self.engine.running)
            if len(self._waiting) - max(free, 0) >= self.queue_limit:
                running = len(self.engine.running)
                raise ApiError(429, f"the server is busy: {running} requests running and {len(self._waiting)} "
                                    f"waiting (--queue {self.queue_limit}); retry after a few seconds",
                               code="queue_full", headers={"Retry-After": str(self.retry_after())})
            job._wake = self._wake
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._cond.notify()

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one request's time, at least 1."""
        return 1 if not self.engine.running else 2

    def drain(self) -> None:
        """Refuse new requests from now on; those accepted run to their end."""
        with self._cond:
            self.draining = True
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------ the thread
    def _loop(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not self._stop and not self._waiting and not engine.running:
                    self._cond.wait()
                if self._stop:
                    return
                for job in [j for j in self._waiting if j.cancelled]:
                    self._waiting.remove(job)
                    self.metrics.cancelled.inc()
                    log.info("request %d: client left while waiting", job.id)
                gone = [j for j in engine.running if j.cancelled]
                admit = []
                while self._waiting and len(engine.running) - len(gone) + len(admit) < engine.capacity:
                    admit.append(self._waiting.popleft())
                self.metrics.queue_depth.set(len(self._waiting))
            for job in gone:
                self._guard(engine.drop, job)
                self.metrics.cancelled.inc()
                log.info("request %d: client left; its row is free", job.id)
            for job in admit:
                self._guard(engine.start, job)
            self.metrics.running.set(len(engine.running))
            if engine.running:
                made = self._guard(engine.step, None)
                for unit, n in (made.items() if isinstance(made, dict) else ((engine.unit, made),)):
                    if n:
                        self.metrics.produced(n, unit)
            self.metrics.running.set(len(engine.running))

    def _guard(self, call, job: Job | None):
        """Run ``call(job)`` (or ``call()``); a user error refuses ``job``, a bug fails the jobs it touched."""
        try:
            return call(job) if job is not None else call()
        except KzttsError as exc:
            if job is None:  # a step refused: every running job stops with the message
                self._fail_all(ApiError(400, str(exc), code="invalid_value"))
            else:
                if job in self.engine.running:
                    self._guard(self.engine.drop, job)
                job.fail(ApiError(400, str(exc), code="invalid_value"))
        except Exception:
            log.exception("bug in the scheduler while %s; the requests it touched end with a 500",
                          f"running request {job.id}" if job is not None else "stepping the batch")
            error = ApiError(500, "internal error in kztts (the traceback is in the server log; please report it)",
                             code="internal_error")
            if job is not None and not job.finished:
                job.fail(error)
            self._fail_all(error)
        return 0

    def _fail_all(self, error: ApiError) -> None:
        for j in list(self.engine.running):
            if not j.finished:
                j.fail(error)
        try:
            self.engine.reset()
        except Exception:
            log.exception("resetting the engine failed")
