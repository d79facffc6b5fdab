"""The end of fit's direct question to the tracking server: can it take data now? One request, no retries."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hvd_mlflow.delivery.reachability import cannot_answer
from tests.support.mlflow_server import free_port

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


@contextmanager
def server(status: int | None) -> Iterator[str]:
    """A local HTTP server answering ``status`` to everything (``None``: it accepts and closes every connection
    without an answer, as a load balancer whose backend is dead)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if status is None:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_closed_port_a_closing_front_and_a_5xx_cannot_answer_any_answer_below_500_can():
    assert cannot_answer(f"http://127.0.0.1:{free_port()}")  # refused
    with server(None) as url:
        assert cannot_answer(url)  # accepted, closed without an answer
    for status in (500, 502, 503, 504):
        with server(status) as url:
            assert cannot_answer(url + "/prefix"), status
    for status in (200, 401, 403, 404):
        with server(status) as url:
            assert not cannot_answer(url), status
            assert not cannot_answer(url.replace("http://", "http://user:secret@") + "/path?x=1"), status


def test_a_listener_that_never_answers_proves_nothing():
    with socket.socket() as listening:  # accepts (the kernel's backlog) but never reads nor answers: a time-out
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert cannot_answer(f"http://127.0.0.1:{listening.getsockname()[1]}", timeout=0.3) is False


def test_a_name_that_resolves_nowhere_cannot_answer():
    assert cannot_answer("http://no-such-host.invalid:5000")


@pytest.mark.parametrize("uri", [None, "", "file:///tmp/mlruns", "sqlite:///mlflow.db", "databricks"])
def test_what_is_not_a_server_is_never_called_down(uri):
    assert cannot_answer(uri) is False


def test_behind_a_proxy_the_probe_goes_through_it_as_mlflow_s_requests_do(monkeypatch):
    """The server's own address is out of reach from here; the proxy MLflow's requests go through decides."""
    target = "http://tracking.invalid:5000"  # never looked up nor contacted from here: the proxy answers for it
    with server(200) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        assert cannot_answer(target) is False
    with server(502) as proxy:  # the proxy says its upstream is gone
        monkeypatch.setenv("HTTP_PROXY", proxy)
        assert cannot_answer(target) is True
