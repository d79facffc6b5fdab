"""Whether anything listens at a tracking server's address: one TCP connect, for the end of ``fit`` only.

MLflow's REST client retries a refused connection for minutes (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, exponential
backoff), and says nothing until it gives up: a server that is down for the whole run looks, from the sender, like a
call that is still waiting. At the end of ``fit`` rank 0 must not wait for that (:mod:`hvd_mlflow.delivery.sender`),
so, while nothing has answered, it asks the network directly: a refused or unreachable address is known down at once.
Only where the request would go straight to that address: not through an HTTP proxy (``HTTPS_PROXY`` and its kin,
which a direct connect would bypass), and only for ``http``/``https`` URIs (AzureML's plugin resolves its own).
Runs on rank 0 alone (the sender asks it from a thread of its own, so that a slow name lookup never holds up the
end of ``fit``), decides no collective, and never raises.

Example::

    refuses("http://127.0.0.1:9")  # True: nothing listens there
"""

from __future__ import annotations

import socket
import urllib.request
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 1.0


def refuses(tracking_uri: str | None, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """True when a TCP connection to ``tracking_uri``'s host and port is refused, or the address is unreachable or
    its name resolves nowhere: a server that cannot answer. False when the connection is accepted, when it only
    takes long (a lost packet, a busy host: not proof), or when the question does not apply (not HTTP, a proxy)."""
    try:
        parts = urlsplit(tracking_uri or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False
        if _proxied(parts.scheme, parts.hostname):
            return False
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return False
    except TimeoutError:  # (socket.timeout) no answer yet is not a refusal
        return False
    except OSError:  # refused, host or network unreachable, no route, name not resolved
        return True
    except Exception:  # noqa: BLE001 - a malformed address (a ValueError, a UnicodeError): no answer either way
        return False


def _proxied(scheme: str, host: str) -> bool:
    proxies = urllib.request.getproxies()
    return bool(proxies.get(scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(host)
