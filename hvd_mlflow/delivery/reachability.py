"""Whether the tracking server can take data now: one request without retries, for the end of ``fit`` only.

MLflow's REST client retries a refused connection, a connection closed without an answer and a 5xx answer for minutes
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, exponential backoff), and says nothing until it gives up: a server that is down
for the whole run looks, from the sender, like a call that is still waiting. At the end of ``fit`` rank 0 must not
wait for that (:mod:`hvd_mlflow.delivery.sender`), so, while nothing has answered, it asks the server directly, once,
with a short timeout: an address that refuses, a front that accepts the connection and closes it without an answer (a
load balancer whose backend is dead), an answer of 500 or more (AzureML's front during an outage: 503), or a name that
resolves nowhere: the server cannot take data now. Any answer below 500 (even 401 or 404) says that it can; a request
that only takes long proves nothing. The question is MLflow's own read of experiment 0, sent through MLflow's REST
layer with the tracking store's own credentials (``MLFLOW_TRACKING_TOKEN``, the azureml-mlflow plugin's workspace path
and token for an ``azureml://`` URI), so it goes where MLflow's requests go, the same way (proxies, CA bundle, TLS
settings), with ``max_retries=0``. The probe never imports MLflow itself: until the sender's thread has imported it,
the question is one plain GET of an HTTP(S) server's URL through ``requests`` (the same proxies and CA bundle), and an
``azureml://`` URI is not asked yet. Runs on rank 0 alone (the sender asks it from a thread of its own, so that a slow
name lookup never holds up the end of ``fit``), decides no collective, and never raises.

Example::

    cannot_answer("http://127.0.0.1:9")  # True: nothing listens there
"""

from __future__ import annotations

import ssl
import sys
from urllib.parse import urlsplit, urlunsplit

TIMEOUT_S = 1.0
PROBE_ENDPOINT = "/api/2.0/mlflow/experiments/get"  # a read every MLflow tracking server serves (experiment 0)


def cannot_answer(tracking_uri: str | None, timeout: float = TIMEOUT_S) -> bool:
    """True when the tracking server cannot take data now: its address refuses or is unreachable, its name resolves
    nowhere, the connection is closed without an answer, or the answer is 500 or more. False when it answers below 500,
    when the question only takes long (a lost packet, a busy host: not proof), or when it does not apply (a file or
    database store)."""
    scheme = urlsplit(tracking_uri or "").scheme
    if scheme not in ("http", "https", "azureml"):
        return False
    try:
        if not _imported("mlflow", "mlflow.utils.rest_utils", "mlflow.tracking._tracking_service.utils"):
            return _plain(tracking_uri, timeout) if scheme != "azureml" else False
        from mlflow.tracking._tracking_service.utils import _get_store
        from mlflow.utils.rest_utils import http_request

        creds = _get_store(tracking_uri).get_host_creds()  # a store without any: AttributeError, proof of nothing
        answer = http_request(creds, PROBE_ENDPOINT, "GET", max_retries=0, timeout=timeout,
                              raise_on_status=False, params={"experiment_id": "0"})  # fmt: skip
        return answer.status_code >= 500
    except Exception as error:  # noqa: BLE001 - a probe never raises: only a plain "no answer" is proof
        return _no_answer(error)


def _imported(*names: str) -> bool:
    """Whether these modules are imported, whole: the probe never imports MLflow itself (the sender's thread may be
    importing it, and two threads importing MLflow's modules at once can leave one of them half-initialised)."""
    for name in names:
        module = sys.modules.get(name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            return False
    return True


def _plain(tracking_uri: str, timeout: float) -> bool:
    """Before MLflow is imported: one plain GET of an HTTP(S) server's URL (without its credentials), through the same
    proxies and CA bundle (``requests``, as MLflow's own)."""
    import requests

    parts = urlsplit(tracking_uri)
    netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    url = urlunsplit((parts.scheme, netloc or "", parts.path or "/", "", ""))
    try:
        with requests.get(url, timeout=timeout, allow_redirects=False, stream=True) as answer:
            return answer.status_code >= 500
    except Exception as error:  # noqa: BLE001 - a probe never raises
        return _no_answer(error)


def _no_answer(error: BaseException | None) -> bool:
    """Whether ``error`` from the probe proves the server cannot answer: a connection that failed (refused,
    unreachable, a name that resolves nowhere) or was closed without an answer. Not when its first cause is a time-out
    (not proof) or a TLS failure (the server did answer, in TLS). MLflow wraps the HTTP library's errors, which wrap
    urllib3's (a refusal arrives as urllib3's ``NewConnectionError``, a kind of its ``ConnectTimeoutError``): the first
    cause, at the end of the chain, tells which."""
    import requests

    chain = []
    while error is not None and len(chain) < 10:
        chain.append(error)
        error = error.__cause__ or error.__context__
    if not chain or isinstance(chain[-1], (TimeoutError, ssl.SSLError)):
        return False
    return any(isinstance(e, requests.exceptions.ConnectionError) for e in chain)
