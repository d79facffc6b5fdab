"""The end of fit's direct question to the network: does anything listen at the tracking server's address?"""

from __future__ import annotations

import socket

import pytest

from hvd_mlflow.delivery.reachability import refuses
from tests.support.mlflow_server import free_port


def test_a_closed_port_refuses_and_a_listening_one_does_not(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert refuses(f"http://127.0.0.1:{free_port()}")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert not refuses(f"http://127.0.0.1:{port}/")
        assert not refuses(f"https://user:secret@127.0.0.1:{port}/path?x=1")


def test_a_name_that_resolves_nowhere_is_unreachable(monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert refuses("http://no-such-host.invalid:5000")


@pytest.mark.parametrize("uri", [None, "", "file:///tmp/mlruns", "sqlite:///mlflow.db", "databricks",
                                 "azureml://westeurope.api.azureml.ms/mlflow/v1.0/subscriptions/s"])  # fmt: skip
def test_what_is_not_a_plain_http_address_is_never_called_down(uri):
    assert refuses(uri) is False


def test_behind_a_proxy_a_direct_connect_proves_nothing(monkeypatch):
    port = free_port()
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert refuses(f"http://10.1.2.3:{port}") is False
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # bypassed: the request goes straight there, and so does the probe
    assert refuses(f"http://127.0.0.1:{port}") is True
