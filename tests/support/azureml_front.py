"""A faithful offline stand-in for AzureML's MLflow endpoint, in front of a real ``mlflow server``.

The real ``azureml-mlflow`` plugin talks to it exactly as to AzureML (../shared/AZUREML.md): HTTPS with a
certificate for ``localhost`` (trusted through ``REQUESTS_CA_BUNDLE``), ``Authorization: Bearer <JWT>``, a
User-Agent carrying ``azureml-mlflow/<version>``, and paths under
``/mlflow/v2.0/subscriptions/<s>/resourceGroups/<g>/providers/Microsoft.MachineLearningServices/workspaces/<w>``.
The front checks all of that, strips the prefix, forwards to the server and records every request. It also
behaves as AzureML does where MLflow's server does not: the ``log-batch-async`` / ``get-run-data-status``
endpoints, 400 for more than 250 values of one key in one request, 404 for the logged-models API, and the
artifact path the plugin takes (``/history/v1.0/.../artifacts/batch/metadata`` hands out blob URLs with a
SAS, at most 100 paths per batch, no overwriting; the blobs are then PUT to the front and kept in
``artifact_dir``). Runs get an ``azureml://.../experiments/<name>/runs/<id>/artifacts`` artifact URI when their
experiment is created with :meth:`AzureMLFront.artifact_location`.
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
HISTORY = re.compile(
    r"^/history/v1\.0/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/"
    r"Microsoft\.MachineLearningServices/workspaces/(?P<ws>[^/]+)/experiments/(?P<exp>[^/]+)/runs/(?P<run>[^/]+)"
    r"/artifacts/batch/metadata$"
)
MAX_ARTIFACTS_PER_BATCH = 100
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
        self.artifact_dir = folder / "blobs"
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

    def artifact_location(self, experiment_name: str) -> str:
        """The artifact location AzureML gives an experiment: runs' artifacts go through the artifact service."""
        return (
            f"azureml://localhost:{self.port}/mlflow/v2.0/subscriptions/{SUBSCRIPTION}/resourceGroups/"
            f"{RESOURCE_GROUP}/providers/Microsoft.MachineLearningServices/workspaces/{WORKSPACE}/experiments/"
            f"{experiment_name}/runs"
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

    def _blob(self, request: Recorded) -> Respond:
        """Azure Blob Storage's Put Blob on a SAS URL handed out by the artifact service (no overwrite)."""
        path, _, query = request.path.partition("?")
        if "sig=" not in query:
            return self._reject(request, 403, "blob request without a SAS signature")
        target = self.artifact_dir / path.removeprefix("/blob/")
        if request.method != "PUT":
            return Respond(405, {}, b"")
        if target.exists():
            return Respond(409, {"x-ms-error-code": "BlobAlreadyExists"}, b"")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(request.body)
        headers = {
            "ETag": f'"0x{uuid.uuid4().hex[:16].upper()}"',
            "Last-Modified": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()),
            "x-ms-request-id": str(uuid.uuid4()),
            "x-ms-version": "2023-11-03",
            "x-ms-request-server-encrypted": "true",
        }
        return Respond(201, headers, b"")

    def _batch_metadata(self, request: Recorded, experiment: str, run_id: str) -> Respond:
        """The artifact service: empty artifacts and a blob URL (with a SAS) for each path."""
        paths = [item["path"] for item in request.json().get("paths", [])]
        if len(paths) > MAX_ARTIFACTS_PER_BATCH:
            body = {"error": {"code": "UserError", "message": "at most 100 paths per batch"}}
            return Respond(400, {}, json.dumps(body).encode())
        container = f"dcid.{run_id}"
        if any((self.artifact_dir / container / p).exists() for p in paths):
            body = {"error": {"code": "UserError", "message": "artifact already exists and cannot be overwritten"}}
            return Respond(409, {"Content-Type": "application/json"}, json.dumps(body).encode())
        info = {"origin": "ExperimentRun", "container": container}
        answer = {
            "artifacts": {p: {**info, "path": p, "artifactId": f"ExperimentRun/{container}/{p}"} for p in paths},
            "artifactContentInformation": {
                p: {**info, "path": p, "contentUri": f"https://localhost:{self.port}/blob/{container}/{p}?sig=offline"}
                for p in paths
            },
            "errors": {},
        }
        return Respond(200, {"Content-Type": "application/json"}, json.dumps(answer).encode())

    def intercept(self, request: Recorded):
        if request.path.startswith("/blob/"):
            return self._blob(request)
        auth = request.headers.get("Authorization", "")
        try:
            jwt.decode(auth.removeprefix("Bearer "), SECRET, algorithms=["HS256"], options={"verify_aud": False})
        except jwt.PyJWTError as error:
            return self._reject(request, 401, f"bad bearer token: {error}")
        history = HISTORY.match(request.path.split("?")[0])
        if history and (history["sub"], history["rg"], history["ws"]) == (SUBSCRIPTION, RESOURCE_GROUP, WORKSPACE):
            return self._batch_metadata(request, history["exp"], history["run"])
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
