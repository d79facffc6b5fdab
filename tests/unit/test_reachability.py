"""The end of fit's direct question to the tracking server: can it take data now? One request, no retries."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hvd_mlflow.delivery import reachability
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


@pytest.fixture(autouse=True, params=["through MLflow", "before MLflow is imported"])
def path(request, monkeypatch):
    """Every question both ways: through MLflow's REST layer, and as one plain GET while the sender's thread has not
    imported MLflow yet (the probe never imports it itself)."""
    import mlflow.tracking._tracking_service.utils  # noqa: F401 - the first way needs MLflow imported whole
    import mlflow.utils.rest_utils  # noqa: F401

    if request.param != "through MLflow":
        monkeypatch.setattr(reachability, "_imported", lambda *names: False)
    return request.param


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


def test_while_mlflow_is_being_imported_the_probe_does_not_import_it(monkeypatch, path):
    """A module still executing (another thread importing it) counts as not imported: the probe then takes the plain
    way, or, for an ``azureml://`` URI (whose address only the plugin knows), proves nothing yet."""
    if path != "through MLflow":
        pytest.skip("one way is enough")
    import mlflow.utils.rest_utils

    monkeypatch.setattr(mlflow.utils.rest_utils.__spec__, "_initializing", True, raising=False)
    assert reachability._imported("mlflow", "mlflow.utils.rest_utils") is False
    monkeypatch.setattr(reachability, "_plain", lambda uri, timeout: pytest.fail("azureml:// asked the plain way"))
    assert cannot_answer("azureml://127.0.0.1:9/mlflow/v1.0/subscriptions/s/resourceGroups/g/workspaces/w") is False


def test_before_mlflow_is_imported_the_probe_answers_without_importing_it(path):
    """A fresh process (the sender's thread has not imported MLflow yet): the probe answers at once, from a refused
    address and a front closing every connection, and leaves MLflow unimported (an import there would race the
    sender's own, and take longer than the end of fit waits for the answer)."""
    if path != "through MLflow":
        pytest.skip("one way is enough")
    code = (
        "import sys, time; from hvd_mlflow.delivery.reachability import cannot_answer; "
        "t = time.monotonic(); down = [cannot_answer(u) for u in sys.argv[1:]]; "
        "print(down, round(time.monotonic() - t, 2), 'mlflow' in sys.modules)"
    )
    with server(None) as closing, server(200) as up:
        argv = [f"http://127.0.0.1:{free_port()}", closing, up]
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    down, took, imported = out.stdout.rsplit(" ", 2) if out.stdout else ("", "", "")
    assert (down, imported.strip()) == ("[True, True, False]", "False"), out.stdout + out.stderr[-2000:]
    assert float(took) < 1.5, took
