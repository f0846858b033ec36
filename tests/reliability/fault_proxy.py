"""A test-only HTTP proxy in front of moto's S3 server that injects faults.

The jobs talk to the proxy as their S3 endpoint; the proxy forwards each request to
moto, or, when its :class:`FaultPlan` says so, answers an S3 error itself (500
InternalError, 503 SlowDown), closes the connection without an answer, or is not
there at all: :meth:`FaultProxy.down` closes the listening socket and every open
connection, :meth:`FaultProxy.up` listens again on the same port. moto keeps its
buckets in its own process, so an endpoint that goes away and comes back with its data
intact is exactly what a restarted S3 front end looks like to a client.

Listens on 127.0.0.1 only; :meth:`FaultProxy.close` (or the context manager) stops it.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

# What a rule decides for one request: None (forward it), "drop" (close the connection
# without an answer) or an (HTTP status, S3 error code) pair to answer with.
Fault = tuple[int, str] | str | None
SLOW_DOWN: Fault = (503, "SlowDown")
INTERNAL: Fault = (500, "InternalError")
DROP: Fault = "drop"

_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}


@dataclass
class FaultPlan:
    """Decides, request by request, whether to inject a fault.

    :param rule: ``rule(method, path, n)`` with ``n`` the 1-based request count; returns
        a :data:`Fault`. The default forwards everything.
    """

    rule: Callable[[str, str, int], Fault] = lambda method, path, n: None
    requests: int = 0
    injected: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self, method: str, path: str) -> Fault:
        with self.lock:
            self.requests += 1
            fault = self.rule(method, path, self.requests)
            if fault is not None:
                self.injected[fault if isinstance(fault, str) else fault[1]] += 1
            return fault


def every(k: int, fault: Fault) -> Callable[[str, str, int], Fault]:
    """Every ``k``-th request gets ``fault``."""
    return lambda method, path, n: fault if n % k == 0 else None


def at_rate(rate: float, fault: Fault, seed: int) -> Callable[[str, str, int], Fault]:
    """Each request gets ``fault`` with probability ``rate`` (seeded, reproducible)."""
    rng = random.Random(seed)
    return lambda method, path, n: fault if rng.random() < rate else None


def always(fault: Fault) -> Callable[[str, str, int], Fault]:
    return lambda method, path, n: fault


def _error_body(code: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected by the test proxy</Message>"
        "<RequestId>fault-proxy</RequestId></Error>"
    ).encode()


class FaultProxy:
    """Forwards HTTP requests from ``127.0.0.1:<port>`` to ``upstream``, with faults."""

    def __init__(self, upstream: str, plan: FaultPlan | None = None) -> None:
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        self.plan = plan or FaultPlan()
        self.port = 0
        self.outages = 0
        self._closed = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.up()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        """Listen (again) on the same port; after :meth:`close`, nothing."""
        if self._server is not None or self._closed:
            return
        server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler_class())
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stop listening and cut every open connection: the endpoint is gone."""
        if self._server is not None:
            self.outages += 1
        self._stop()

    def _stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._connections.clear()
        self._thread.join(timeout=10)

    def close(self) -> None:
        self._closed = True
        self._stop()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with proxy._lock:
                    proxy._connections.add(self.connection)

            def finish(self) -> None:
                with proxy._lock:
                    proxy._connections.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def log_message(self, *args) -> None:  # quiet: pytest shows failures anyway
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    raw = b""
                    while True:
                        line = self.rfile.readline()
                        raw += line
                        size = int(line.split(b";")[0].strip(), 16)
                        if size == 0:
                            while True:  # trailers, then the empty line
                                trailer = self.rfile.readline()
                                raw += trailer
                                if trailer in (b"\r\n", b"\n", b""):
                                    return raw
                        raw += self.rfile.read(size + 2)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                fault = proxy.plan.decide(self.command, self.path)
                if fault == DROP:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault is not None:
                    status, code = fault
                    payload = b"" if self.command == "HEAD" else _error_body(code)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self._forward(body)

            def _forward(self, body: bytes) -> None:
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in {"connection"}
                    }
                    conn.putrequest(
                        self.command, self.path, skip_host=True, skip_accept_encoding=True
                    )
                    for k, v in headers.items():
                        conn.putheader(k, v)
                    conn.endheaders()
                    if body:
                        conn.send(body)
                    resp = conn.getresponse()
                    payload = resp.read()
                    self.send_response(resp.status, resp.reason)
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP_HEADERS and k.lower() != "content-length":
                            self.send_header(k, v)
                    length = resp.getheader("Content-Length")
                    if self.command == "HEAD" and length is not None:
                        self.send_header("Content-Length", length)
                    else:
                        self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler
