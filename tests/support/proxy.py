"""An HTTP proxy in front of the real MLflow server that records every request and can inject faults.

The tests point MLflow's client at the proxy, then read :attr:`Proxy.requests` to count what reached the
server. A fault hook decides, per request, what happens instead of a plain forward:

* ``None``: forward to the server and relay its answer;
* ``Respond(status, headers, body)``: answer without forwarding (429, 503, 400 ...);
* ``RESET``: close the connection without answering;
* ``DROP_RESPONSE``: forward (the server applies the request), then close without answering;
* ``Delay(seconds)``: wait, then forward.

:meth:`Proxy.outage` closes the listening socket for a while and reopens it on the same port: to the client
that is exactly a tracking server that was killed and restarted (connection refused, then answers again).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclasses.dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # 0: no answer was given (reset or dropped)
    client: str = ""

    def json(self) -> dict:
        return json.loads(self.body or b"{}")

    @property
    def is_log_batch(self) -> bool:
        return self.path.split("?")[0].endswith("/runs/log-batch")

    @property
    def metrics(self) -> list[dict]:
        return self.json().get("metrics", []) if self.is_log_batch else []


@dataclasses.dataclass(frozen=True)
class Respond:
    status: int
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "injected"}'


@dataclasses.dataclass(frozen=True)
class Delay:
    seconds: float


RESET = "reset"
DROP_RESPONSE = "drop-response"
Fault = Callable[["Recorded"], "Respond | Delay | str | None"]


class Proxy:
    scheme = "http"

    def __init__(self, upstream: str, fault: Fault | None = None, port: int = 0, host: str = "127.0.0.1"):
        self.upstream = urlsplit(upstream)
        self.fault = fault
        self.requests: list[Recorded] = []
        self.connections: list[str] = []  # the peer address of every TCP connection accepted, in order
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._host = host
        self._server = self._bind(port)
        self.port = self._server.server_address[1]
        self.url = f"{self.scheme}://{host}:{self.port}"

    # -- life cycle ------------------------------------------------------------------------------------
    def _bind(self, port: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer((self._host, port), self._handler_class())
        server.daemon_threads = True
        return server

    def intercept(self, request: Recorded) -> Respond | Delay | str | None:
        """What to do with ``request`` (subclasses add rules; the default asks the fault hook)."""
        return self.fault(request) if self.fault else None

    def _serve(self) -> None:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def __enter__(self) -> Proxy:
        self._serve()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop listening and cut every open connection, as a killed server would."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for sock in list(self._open):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def outage(self, seconds: float) -> threading.Thread:
        """Stop listening now, listen again on the same port after ``seconds`` (in the background)."""
        self.stop()

        def restart() -> None:
            time.sleep(seconds)
            self._server = self._bind(self.port)
            self._serve()

        thread = threading.Thread(target=restart, daemon=True)
        thread.start()
        return thread

    # -- what it saw -----------------------------------------------------------------------------------
    def metric_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.metrics and r.status == 200]

    def log_batches(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.is_log_batch]

    # -- the work --------------------------------------------------------------------------------------
    def _forward(self, request: Recorded) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "connection")}
            connection.request(request.method, request.path, body=request.body or None, headers=headers)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with proxy._lock:
                    proxy._open.add(self.connection)
                    proxy.connections.append(self.client_address[0])

            def finish(self) -> None:
                with proxy._lock:
                    proxy._open.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = Recorded(self.command, self.path, dict(self.headers), body, 0, self.client_address[0])
                with proxy._lock:
                    proxy.requests.append(request)
                action = proxy.intercept(request)
                if isinstance(action, Delay):
                    time.sleep(action.seconds)
                    action = None
                if action == RESET:
                    self._abort()
                    return
                if isinstance(action, Respond):
                    status, headers, payload = action.status, action.headers, action.body
                else:
                    status, headers, payload = proxy._forward(request)
                    if action == DROP_RESPONSE:
                        self._abort()
                        return
                request.status = status
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _abort(self) -> None:
                self.close_connection = True
                try:
                    linger = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # RST, not FIN
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

        return Handler
