"""Running a ``Service`` under uvicorn: the socket bound first (a busy port is a one-line error), the
scheduler started, and SIGTERM / SIGINT turned into a drain: new requests get 503, those accepted run to
their end, then the server exits 0. A second signal stops at once."""
from __future__ import annotations

import logging
import signal
import socket
from typing import Callable

import uvicorn

from kztts.core.errors import KzttsError
from kztts.server.app import build_app
from kztts.server.service import ServeOptions, Service

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server with a drain on the first signal (uvicorn's own handler stops taking requests at
    once and re-raises the signal when done, which would end the process with it instead of 0)."""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame) -> None:
        if self.service.scheduler.draining:
            log.warning("second signal %s: stopping now", signal.Signals(sig).name)
            self.should_exit = self.force_exit = True
            return
        running, waiting = self.service.scheduler.counts()
        log.warning("signal %s: draining (new requests get 503; %d running and %d waiting finish first)",
                    signal.Signals(sig).name, running, waiting)
        self.service.scheduler.drain()

    async def on_tick(self, counter: int) -> bool:
        if self.service.scheduler.draining and self.service.scheduler.idle and not self.should_exit:
            log.warning("drained: every accepted request has ended; exiting")
            self.should_exit = True
        return await super().on_tick(counter)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port), or a ``KzttsError`` naming why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise KzttsError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise KzttsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port "
                         "(or stop what uses it)") from None
    sock.set_inheritable(True)
    return sock


def serve(options: ServeOptions, on_ready: Callable[[str], None] | None = None) -> int:
    """Open the bundle, listen, answer until drained by a signal; 0 when drained."""
    options.check()
    sock = bind(options.host, options.port)  # first: a busy port fails before minutes of loading
    try:
        service = Service.open(options)  # connections wait in the socket's backlog meanwhile
    except BaseException:
        sock.close()
        raise
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    config = uvicorn.Config(build_app(service), log_level="warning", access_log=False, lifespan="off",
                            timeout_keep_alive=5)
    server = _Server(config, service)
    service.start()
    if on_ready is not None:
        on_ready(url)
    try:
        server.run(sockets=[sock])
    finally:
        service.close()
        sock.close()
    return 0
