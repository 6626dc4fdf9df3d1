"""kztts.server.run: the socket is bound before the bundle opens (a busy port or a bad host is one line, and no
minutes of loading), a failed open closes it, and the first signal drains (new requests 503, the accepted ones run
to their end) where uvicorn would stop, the second stops at once (a served process's SIGTERM:
tests/server/test_serve.py)."""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import SimpleNamespace

import pytest
import uvicorn

from kztts.core.errors import KzttsError
from kztts.server import run as server_run
from kztts.server.metrics import Metrics
from kztts.server.scheduler import Scheduler
from kztts.server.service import ServeOptions


def test_bind_listens_on_a_free_port():
    sock = server_run.bind("127.0.0.1", 0)
    try:
        host, port = sock.getsockname()[:2]
        assert host == "127.0.0.1" and port > 0 and sock.get_inheritable()
        with socket.create_connection((host, port), timeout=5):
            pass  # the backlog takes the connection before anything serves it
    finally:
        sock.close()


def test_a_busy_port_or_a_bad_host_is_one_line(monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        with pytest.raises(KzttsError, match=f"cannot listen on 127.0.0.1:{port}: .*; choose another --port"):
            server_run.bind("127.0.0.1", port)
    finally:
        busy.close()

    def unknown(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(server_run.socket, "getaddrinfo", unknown)
    with pytest.raises(KzttsError, match=r"--host nowhere: not an address of this machine \(Name or service"):
        server_run.bind("nowhere", 8000)


def test_serve_checks_and_binds_before_it_opens_the_bundle(tmp_path, monkeypatch):
    def must_not_open(options):
        raise AssertionError("the bundle was opened")

    monkeypatch.setattr(server_run.Service, "open", must_not_open)
    with pytest.raises(KzttsError, match="--batch must be"):
        server_run.serve(ServeOptions(bundle=tmp_path, batch=0))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        with pytest.raises(KzttsError, match="cannot listen on"):
            server_run.serve(ServeOptions(bundle=tmp_path, port=busy.getsockname()[1]))
    finally:
        busy.close()


def test_a_bundle_that_fails_to_open_closes_the_socket(tmp_path, monkeypatch):
    bound = []

    def bind(host, port):
        bound.append(socket.socket())
        return bound[-1]

    def fails(options):
        raise KzttsError("not a bundle")

    monkeypatch.setattr(server_run, "bind", bind)
    monkeypatch.setattr(server_run.Service, "open", fails)
    with pytest.raises(KzttsError, match="not a bundle"):
        server_run.serve(ServeOptions(bundle=tmp_path))
    assert bound[0].fileno() == -1  # closed


def _server():
    engine = SimpleNamespace(running=[], capacity=1)
    service = SimpleNamespace(scheduler=Scheduler(engine, 4, Metrics()))
    return server_run._Server(uvicorn.Config(lambda scope, receive, send: None), service), service, engine


def test_the_first_signal_drains_the_second_stops(caplog):
    server, service, engine = _server()
    engine.running = ["a request"]
    with caplog.at_level(logging.WARNING, logger="kztts.server.run"):
        server.handle_exit(signal.SIGTERM, None)
        assert service.scheduler.draining and not server.should_exit  # draining, not stopping
        assert not asyncio.run(server.on_tick(1))  # a request still runs: the server goes on
        server.handle_exit(signal.SIGINT, None)
    assert server.should_exit and server.force_exit
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["signal SIGTERM: draining (new requests get 503; 1 running and 0 waiting finish first)",
                        "second signal SIGINT: stopping now"]


def test_a_drained_server_exits_at_its_next_tick(caplog):
    server, service, engine = _server()
    assert not asyncio.run(server.on_tick(1))  # not draining: goes on
    server.handle_exit(signal.SIGTERM, None)
    with caplog.at_level(logging.WARNING, logger="kztts.server.run"):
        assert asyncio.run(server.on_tick(1))  # nothing running or waiting: exits (with 0, serve's return)
    assert server.should_exit and not server.force_exit
    assert "drained: every accepted request has ended; exiting" in caplog.text
