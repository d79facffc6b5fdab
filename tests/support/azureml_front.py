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

It enforces AzureML's documented per-run limits (../shared/AZUREML.md, "Limits and unsupported calls"), counting
what each run holds (read from the server the first time the run is seen, then kept up to date): 50 metric names,
1 million rows per metric name (``max_rows_per_metric`` lowers it for a test), 50 tags (the run's system tags
included) with keys of at most 100 characters and values of at most 1,000, 200 params. A request that would pass
one is refused whole with a 400. The exact text AzureML answers for the metric-name, tag and row limits is
unverified: the front answers in the shape AZUREML.md documents for the params limit (``ValidationError: A field
of the entity is over the size limit. FieldName=..., Limit=..., Size=...``). ``refuse_metric_names`` refuses
requests carrying those names (a name the service will not take); :meth:`storm` answers 429 with ``Retry-After``
to every request for a while. (The async log-batch endpoint, which hvd-mlflow never uses, is not counted.)
What it cannot prove: Studio's rendering, real throttling thresholds, real token refresh.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import ipaddress
import json
import re
import ssl
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import jwt

from tests.support.proxy import DROP_RESPONSE, RESET, Fault, Proxy, Recorded, Respond

SECRET = "offline-test-signing-key-of-32-bytes-or-more"
SUBSCRIPTION, RESOURCE_GROUP, WORKSPACE = "00000000-1111-2222-3333-444444444444", "rg-offline", "ws-offline"
HISTORY = re.compile(
    r"^/history/v1\.0/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/"
    r"Microsoft\.MachineLearningServices/workspaces/(?P<ws>[^/]+)/experiments/(?P<exp>[^/]+)/runs/(?P<run>[^/]+)"
    r"/artifacts/batch/metadata$"
)
MAX_ARTIFACTS_PER_BATCH = 100
METRIC_NAMES_PER_RUN, ROWS_PER_METRIC, TAGS_PER_RUN, TAG_KEY_LENGTH, TAG_VALUE_LENGTH, PARAMS_PER_RUN = (
    50, 1_000_000, 50, 100, 1000, 200,
)  # fmt: skip
WRITES = ("/runs/log-batch", "/runs/log-metric", "/runs/set-tag", "/runs/log-parameter")  # counted and limited
PREFIX = re.compile(
    r"^/mlflow/v2\.0/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/"
    r"Microsoft\.MachineLearningServices/workspaces/(?P<ws>[^/]+)"
)


def token(seconds: int = 3600) -> str:
    """An HS256 JWT like the one AzureML puts in MLFLOW_TRACKING_TOKEN (the client reads only ``exp``)."""
    return jwt.encode({"exp": int(time.time()) + seconds, "aud": "https://management.azure.com"}, SECRET, "HS256")


def self_signed_certificate(folder: Path, host: str = "localhost", address: str = "127.0.0.1") -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
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
            x509.SubjectAlternativeName([x509.DNSName(host), x509.IPAddress(ipaddress.ip_address(address))]),
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


@dataclasses.dataclass
class RunHolds:
    """What one run holds, as AzureML counts it against its limits."""

    metric_rows: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    tag_keys: set[str] = dataclasses.field(default_factory=set)
    param_keys: set[str] = dataclasses.field(default_factory=set)


class AzureMLFront(Proxy):
    scheme = "https"

    def __init__(
        self,
        upstream: str,
        folder: Path,
        fault: Fault | None = None,
        max_rows_per_metric: int = ROWS_PER_METRIC,
        refuse_metric_names: tuple[str, ...] = (),
        host: str = "localhost",
        address: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.host = host  # the name the clients use (the certificate's), listening on ``address``
        self.cert, self._key = self_signed_certificate(folder, host, address)
        self.rejected: list[tuple[str, str]] = []
        self.over_limit: list[str] = []  # the limit messages answered (a 400 each)
        self.artifact_dir = folder / "blobs"
        self.max_rows_per_metric = max_rows_per_metric
        self.refuse_metric_names = set(refuse_metric_names)
        self._holds: dict[str, RunHolds] = {}
        self._writes = threading.Lock()  # check, forward, count: one write at a time
        self._storm: tuple[float, int] | None = None  # (until, Retry-After seconds)
        self.storm_answers = 0
        super().__init__(upstream, fault=fault, host=address, port=port)
        self.url = f"https://{host}:{self.port}"

    def storm(self, seconds: float, retry_after: int = 2) -> None:
        """Answer 429 with ``Retry-After`` to every request for ``seconds`` from now (AzureML throttling)."""
        self._storm = (time.monotonic() + seconds, retry_after)

    def holds(self, run_id: str) -> RunHolds:
        return self._holds[run_id]

    def _bind(self, port: int):
        server = super()._bind(port)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self._key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        return server

    @property
    def tracking_uri(self) -> str:
        return (
            f"azureml://{self.host}:{self.port}/mlflow/v1.0/subscriptions/{SUBSCRIPTION}/resourceGroups/"
            f"{RESOURCE_GROUP}/providers/Microsoft.MachineLearningServices/workspaces/{WORKSPACE}"
        )

    def artifact_location(self, experiment_name: str) -> str:
        """The artifact location AzureML gives an experiment: runs' artifacts go through the artifact service."""
        return (
            f"azureml://{self.host}:{self.port}/mlflow/v2.0/subscriptions/{SUBSCRIPTION}/resourceGroups/"
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
                p: {
                    **info,
                    "path": p,
                    "contentUri": f"https://{self.host}:{self.port}/blob/{container}/{p}?sig=offline",
                }
                for p in paths
            },
            "errors": {},
        }
        return Respond(200, {"Content-Type": "application/json"}, json.dumps(answer).encode())

    def _within_limits(self, request: Recorded, path: str) -> Respond:
        """Refuse what would pass a per-run limit (a 400, nothing applied); else forward and count it."""
        body = request.json()
        run_id = body.get("run_id") or body.get("run_uuid")
        with self._writes:
            holds = self._holds.get(run_id) or self._read_holds(request, run_id)
            metrics = [{"key": body.get("key")}] if path.endswith("/runs/log-metric") else body.get("metrics", [])
            tags = [body] if path.endswith("/runs/set-tag") else body.get("tags", [])
            params = [body] if path.endswith("/runs/log-parameter") else body.get("params", [])
            rows = collections.Counter(m["key"] for m in metrics)
            problems = self._problems(holds, rows, tags, params)
            if problems:
                self.over_limit.append(problems[0])
                answer = {"error_code": "INVALID_PARAMETER_VALUE", "message": problems[0]}
                return Respond(400, {}, json.dumps(answer).encode())
            status, headers, answer = self._forward(request)
            if status == 200:
                holds.metric_rows.update(rows)
                holds.tag_keys |= {t["key"] for t in tags}
                holds.param_keys |= {p["key"] for p in params}
            return Respond(status, headers, answer)

    def _problems(self, holds: RunHolds, rows: collections.Counter, tags: list, params: list) -> list[str]:
        """What this write would pass, of AzureML's per-run limits (first problem first)."""
        problems = [f"INVALID_PARAMETER_VALUE: metric {k!r} is not accepted" for k in sorted(rows)
                    if k in self.refuse_metric_names]  # fmt: skip
        names = len(set(holds.metric_rows) | set(rows))
        if names > METRIC_NAMES_PER_RUN:
            problems.append(_too_big("MetricNames", METRIC_NAMES_PER_RUN, names))
        for key, count in rows.items():
            if holds.metric_rows[key] + count > self.max_rows_per_metric:
                problems.append(_too_big("MetricRows", self.max_rows_per_metric, holds.metric_rows[key] + count))
        tag_count = len(holds.tag_keys | {t["key"] for t in tags})
        if tag_count > TAGS_PER_RUN:
            problems.append(_too_big("Tags", TAGS_PER_RUN, tag_count))
        for tag in tags:
            if len(tag["key"]) > TAG_KEY_LENGTH:
                problems.append(_too_big("Tags.Key", TAG_KEY_LENGTH, len(tag["key"])))
            if len(str(tag.get("value", ""))) > TAG_VALUE_LENGTH:
                problems.append(_too_big("Tags.Value", TAG_VALUE_LENGTH, len(str(tag.get("value", "")))))
        param_count = len(holds.param_keys | {p["key"] for p in params})
        if param_count > PARAMS_PER_RUN:
            problems.append(_too_big("Parameters", PARAMS_PER_RUN, param_count))
        return problems

    def _read_holds(self, request: Recorded, run_id: str) -> RunHolds:
        """What the run holds already (the control plane's tags, a restarted job's metrics), from the server."""
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        query = urlencode({"run_id": run_id})
        _, _, answer = self._forward(Recorded("GET", f"/api/2.0/mlflow/runs/get?{query}", headers, b"", 0))
        data = json.loads(answer or b"{}").get("run", {}).get("data", {})
        holds = RunHolds()
        for metric in data.get("metrics", []):
            query = urlencode({"run_id": run_id, "metric_key": metric["key"], "max_results": 25000})
            _, _, points = self._forward(Recorded("GET", f"/api/2.0/mlflow/metrics/get-history?{query}", headers,
                                                  b"", 0))  # fmt: skip
            holds.metric_rows[metric["key"]] = len(json.loads(points or b"{}").get("metrics", []))
        holds.tag_keys = {t["key"] for t in data.get("tags", [])}
        holds.param_keys = {p["key"] for p in data.get("params", [])}
        self._holds[run_id] = holds
        return holds

    def intercept(self, request: Recorded):
        if request.path.startswith("/blob/"):  # the fault may lose the answer of a blob written (DROP_RESPONSE)
            answer = self._blob(request)
            lost = answer.status == 201 and self.fault is not None and self.fault(request) == DROP_RESPONSE
            return RESET if lost else answer
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
        if self._storm is not None and time.monotonic() < self._storm[0]:
            self.storm_answers += 1
            body = b'{"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "throttled"}'
            return Respond(429, {"Retry-After": str(self._storm[1])}, body)
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
        if path.endswith(WRITES):
            return self._within_limits(request, path)
        if path.endswith("/preview/mlflow/runs/log-batch-async"):
            request.path = request.path.replace("/preview/mlflow/runs/log-batch-async", "/mlflow/runs/log-batch")
            status, _, body = self._forward(request)
            answer = {"batch_tracking_id": uuid.uuid4().hex} if status == 200 else json.loads(body or b"{}")
            return Respond(status, {"Content-Type": "application/json"}, json.dumps(answer).encode())
        if path.endswith("/preview/mlflow/runs/get-run-data-status"):
            return Respond(200, {"Content-Type": "application/json"}, b'{"is_complete": true}')
        return None


def _too_big(field: str, limit: int, size: int) -> str:
    """AzureML's shape for a limit (verified for the params limit; the same shape is assumed for the others)."""
    head = "ValidationError: A field of the entity is over the size limit."
    return f"{head} FieldName={field}, Limit={limit}, Size={size}"
