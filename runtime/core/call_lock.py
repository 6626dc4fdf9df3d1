"""One call at a time on an object whose runners keep state between runs (``kztts.TTS``).

The Talker, the Code Predictor and the decoders keep their KV caches, IO bindings and
decoder history in the runner, not in the call, so two calls interleaved on one object
would overwrite each other's buffers. ``CallLock`` serialises them: a call from a second
thread waits until the first returns; a stream (a generator) holds the lock from its first
chunk until it is exhausted or closed. Calls nested inside a running call of the same thread
(a long-text layer calling ``stream`` per piece) are allowed; a call started by a thread while
its own stream is paused at a chunk is refused, since it would reset that stream's state.
"""
from __future__ import annotations

import functools
import inspect
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from kztts.core.errors import KzttsError

F = TypeVar("F", bound=Callable)


class CallLock:
    """A per-thread reentrant lock that knows which of its holders are paused streams."""

    def __init__(self, what: str):
        self._what = what
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._paused = 0  # holders of the owner thread suspended at a yield

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the body; another thread waits, a paused stream of this thread refuses."""
        me = threading.get_ident()
        if self._owner == me:
            if self._paused:
                raise KzttsError(f"this {self._what} has an unfinished stream in this thread: consume it to the end "
                                 "or close() it before the next call, or use a second object")
        else:
            self._lock.acquire()
            self._owner = me
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._lock.release()

    def stream(self, chunks: Iterator) -> Iterator:
        """Yield from ``chunks`` while holding the lock, marked paused between chunks."""
        with self.held():
            try:
                for chunk in chunks:
                    self._paused += 1
                    try:
                        yield chunk
                    finally:
                        self._paused -= 1
                        self._owner = threading.get_ident()  # a stream may be resumed by another thread
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()


def one_call_at_a_time(method: F) -> F:
    """Run ``method`` (a plain or a generator method) under ``self._calls``, a ``CallLock``."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def generator(self, *args, **kwargs):
            yield from self._calls.stream(method(self, *args, **kwargs))
        return generator  # type: ignore[return-value]

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._calls.held():
            return method(self, *args, **kwargs)
    return call  # type: ignore[return-value]
