"""kztts.core.call_lock: one call at a time on an object whose runners keep state between calls. A second thread
waits for a call or a stream to end, a call nested in a running call of the same thread goes through, and a call
from a thread whose own stream is paused at a chunk is refused (on ``kztts.TTS``: tests/tts/test_threads.py)."""
from __future__ import annotations

import threading
import time

import pytest

from kztts.core.call_lock import CallLock, one_call_at_a_time
from kztts.core.errors import KzttsError


class Speaker:
    def __init__(self):
        self._calls = CallLock("speaker")
        self.log: list[str] = []

    @one_call_at_a_time
    def say(self, what: str, hold: float = 0.0) -> str:
        self.log.append(f"start {what}")
        time.sleep(hold)
        self.log.append(f"end {what}")
        return what

    @one_call_at_a_time
    def stream(self, n: int):
        for i in range(n):
            yield i

    @one_call_at_a_time
    def nested(self) -> list:
        return [self.say("inner"), *self.stream(2)]  # a call inside a call of this thread


def test_a_second_thread_waits_for_the_first_call():
    s = Speaker()
    first = threading.Thread(target=s.say, args=("first", 0.2))
    first.start()
    time.sleep(0.05)  # the first call holds the lock
    s.say("second")
    first.join()
    assert s.log == ["start first", "end first", "start second", "end second"]


def test_a_stream_holds_the_lock_until_it_ends_or_closes():
    s = Speaker()
    chunks = s.stream(3)
    assert next(chunks) == 0
    waited = threading.Event()

    def other():
        s.say("other")
        waited.set()

    t = threading.Thread(target=other)
    t.start()
    assert not waited.wait(0.2)  # the stream is open: the other thread waits
    assert list(chunks) == [1, 2]
    t.join(5)
    assert waited.is_set()
    again = s.stream(3)
    next(again)
    again.close()  # closed early: the lock is free
    assert s.say("after") == "after"


def test_nested_calls_go_through_and_a_paused_stream_refuses_its_own_thread():
    s = Speaker()
    assert s.nested() == ["inner", 0, 1]
    chunks = s.stream(3)
    next(chunks)
    with pytest.raises(KzttsError, match="this speaker has an unfinished stream in this thread: consume it"):
        s.say("while paused")
    assert list(chunks) == [1, 2]  # the stream itself goes on
    assert s.say("now") == "now"
