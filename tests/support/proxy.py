"""An HTTP proxy in front of the real MLflow server that records every request (and can inject faults).

The tests point MLflow's client at the proxy, then read :attr:`Proxy.requests` to count what reached the
server: how many ``log-batch`` requests, with what metrics, from whom.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclasses.dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    def json(self) -> dict:
        return json.loads(self.body or b"{}")

    @property
    def metrics(self) -> list[dict]:
        if not self.path.endswith("/runs/log-batch"):
            return []
        return self.json().get("metrics", [])


# A fault hook sees the request and returns None (forward it) or (status, headers, body) to answer instead.
Fault = Callable[[str, str, bytes], "tuple[int, dict[str, str], bytes] | None"]


class Proxy:
    def __init__(self, upstream: str, fault: Fault | None = None) -> None:
        self.upstream = urlsplit(upstream)
        self.fault = fault
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = proxy.fault(self.command, self.path, body) if proxy.fault else None
                if answer is None:
                    status, headers, payload = proxy._forward(
                        self.command, self.path, dict(self.headers), body
                    )
                else:
                    status, headers, payload = answer
                with proxy._lock:
                    proxy.requests.append(Recorded(self.command, self.path, dict(self.headers), body, status))
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes):
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
            connection.request(method, path, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def __enter__(self) -> Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def metric_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.metrics]
