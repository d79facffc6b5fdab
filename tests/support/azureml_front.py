"""A faithful offline stand-in for AzureML's MLflow endpoint, in front of a real ``mlflow server``.

The real ``azureml-mlflow`` plugin talks to it exactly as to AzureML (../shared/AZUREML.md): HTTPS with a
certificate for ``localhost`` (trusted through ``REQUESTS_CA_BUNDLE``), ``Authorization: Bearer <JWT>``, a
User-Agent carrying ``azureml-mlflow/<version>``, and paths under
``/mlflow/v2.0/subscriptions/<s>/resourceGroups/<g>/providers/Microsoft.MachineLearningServices/workspaces/<w>``.
The front checks all of that, strips the prefix, forwards to the server and records every request. It also
behaves as AzureML does where MLflow's server does not: the ``log-batch-async`` / ``get-run-data-status``
endpoints, 400 for more than 250 values of one key in one request, 404 for the logged-models API.
What it cannot prove: Studio's rendering, real throttling thresholds, real token refresh.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import ssl
import time
import uuid
from pathlib import Path

import jwt

from tests.support.proxy import Fault, Proxy, Recorded, Respond

SECRET = "offline-test-signing-key-of-32-bytes-or-more"
SUBSCRIPTION, RESOURCE_GROUP, WORKSPACE = "00000000-1111-2222-3333-444444444444", "rg-offline", "ws-offline"
PREFIX = re.compile(
    r"^/mlflow/v2\.0/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/"
    r"Microsoft\.MachineLearningServices/workspaces/(?P<ws>[^/]+)"
)


def token(seconds: int = 3600) -> str:
    """An HS256 JWT like the one AzureML puts in MLFLOW_TRACKING_TOKEN (the client reads only ``exp``)."""
    return jwt.encode({"exp": int(time.time()) + seconds, "aud": "https://management.azure.com"}, SECRET, "HS256")


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "front.crt", folder / "front.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class AzureMLFront(Proxy):
    scheme = "https"

    def __init__(self, upstream: str, folder: Path, fault: Fault | None = None) -> None:
        self.cert, self._key = self_signed_certificate(folder)
        self.rejected: list[tuple[str, str]] = []
        super().__init__(upstream, fault=fault, host="127.0.0.1")
        self.url = f"https://localhost:{self.port}"

    def _bind(self, port: int):
        server = super()._bind(port)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self._key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        return server

    @property
    def tracking_uri(self) -> str:
        return (
            f"azureml://localhost:{self.port}/mlflow/v1.0/subscriptions/{SUBSCRIPTION}/resourceGroups/"
            f"{RESOURCE_GROUP}/providers/Microsoft.MachineLearningServices/workspaces/{WORKSPACE}"
        )

    def job_environment(self, run_id: str, experiment_id: str) -> dict[str, str]:
        """The MLflow side of an AzureML job's environment, as every process of the job gets it."""
        return {
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "MLFLOW_TRACKING_TOKEN": token(),
            "MLFLOW_RUN_ID": run_id,
            "AZUREML_RUN_ID": run_id,
            "MLFLOW_EXPERIMENT_ID": experiment_id,
            "AZUREML_CURRENT_CLOUD": "AzureCloud",
            "REQUESTS_CA_BUNDLE": str(self.cert),
        }

    def _reject(self, request: Recorded, status: int, why: str) -> Respond:
        self.rejected.append((request.path, why))
        return Respond(status, {}, json.dumps({"error_code": "UNAUTHENTICATED", "message": why}).encode())

    def intercept(self, request: Recorded):
        auth = request.headers.get("Authorization", "")
        try:
            jwt.decode(auth.removeprefix("Bearer "), SECRET, algorithms=["HS256"], options={"verify_aud": False})
        except jwt.PyJWTError as error:
            return self._reject(request, 401, f"bad bearer token: {error}")
        if "azureml-mlflow/" not in request.headers.get("User-Agent", ""):
            return self._reject(request, 403, "User-Agent without azureml-mlflow/")
        match = PREFIX.match(request.path)
        if not match or (match["sub"], match["rg"], match["ws"]) != (SUBSCRIPTION, RESOURCE_GROUP, WORKSPACE):
            return self._reject(request, 404, "not a workspace path")
        request.path = request.path[match.end() :]
        path = request.path.split("?")[0]
        if "/logged-models" in path:
            return Respond(404, {}, b'{"error_code": "ENDPOINT_NOT_FOUND", "message": "no logged-models API"}')
        if path.endswith("/runs/log-batch") or path.endswith("/preview/mlflow/runs/log-batch-async"):
            keys = [m["key"] for m in request.json().get("metrics", [])]
            over = sorted({k for k in keys if keys.count(k) > 250})
            if over:
                message = f"INVALID_PARAMETER_VALUE: too many values for metric {over[0]}. Limit=250"
                return Respond(
                    400, {}, json.dumps({"error_code": "INVALID_PARAMETER_VALUE", "message": message}).encode()
                )
        action = super().intercept(request)
        if action is not None:
            return action
        if path.endswith("/preview/mlflow/runs/log-batch-async"):
            request.path = request.path.replace("/preview/mlflow/runs/log-batch-async", "/mlflow/runs/log-batch")
            status, _, body = self._forward(request)
            answer = {"batch_tracking_id": uuid.uuid4().hex} if status == 200 else json.loads(body or b"{}")
            return Respond(status, {"Content-Type": "application/json"}, json.dumps(answer).encode())
        if path.endswith("/preview/mlflow/runs/get-run-data-status"):
            return Respond(200, {"Content-Type": "application/json"}, b'{"is_complete": true}')
        return None
