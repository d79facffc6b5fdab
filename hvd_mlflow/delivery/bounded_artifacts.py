"""Single artifact files put and removed with a time bound: each request ends by a given moment.

MLflow's artifact repositories retry a request for minutes (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, a 120 s timeout per
try) and take no deadline. For the MLflow server's artifact proxy (``mlflow-artifacts:``, ``http(s)://``) the one
``PUT`` or ``DELETE`` MLflow's own repository would send is sent here with no retry and a timeout that ends by the
given moment, so a caller's thread is never left waiting on a request past it. Other repositories (a local folder,
AzureML's plugin, a cloud store) are called as MLflow calls them: a local copy ends at once; the others keep their
own timeouts, which this module cannot shorten.

One file is stored whole or not at all: the server's proxy writes an upload to a temporary file and stores it only
once it has arrived whole (``mlflow/server/handlers.py``, ``_upload_artifact``), a local repository renames its
temporary file into place.
"""

from __future__ import annotations

import mimetypes
import posixpath
import time
from pathlib import Path
from typing import Any

# a request never gets less than this: below it even a local server's answer would be cut
MIN_REQUEST_S = 0.2
MIN_DELETE_S = 1.0  # removing what was sent gets at least this, even once its moment has passed
CONNECT_S = 2.0  # at most this of a request's time for connecting; the rest waits for the answer


class NoAnswer(Exception):
    """The store did not answer a request within the time it had."""


class DeadlinePassed(Exception):
    """The moment a request had to end by came before it could start."""


def put(repo: Any, local_file: Path, artifact_dir: str | None, end: float) -> None:
    """Store ``local_file`` as ``artifact_dir/<its name>`` in ``repo``; over HTTP the request ends by ``end``."""
    timeout = _timeout(end)
    http = _http(repo)
    if http is None:
        repo.log_artifact(str(local_file), artifact_dir)
        return
    from mlflow.utils.rest_utils import augmented_raise_for_status, http_request

    endpoint = posixpath.join("/", *([artifact_dir] if artifact_dir else []), local_file.name)
    content_type = mimetypes.guess_type(local_file.name)[0] or "application/octet-stream"
    began = time.monotonic()
    try:
        with open(local_file, "rb") as body:
            answer = http_request(http, endpoint, "PUT", data=body, extra_headers={"Content-Type": content_type},
                                  max_retries=0, timeout=timeout)  # fmt: skip
    except Exception as error:
        if time.monotonic() - began >= timeout[1] - 0.1:  # the wait for the answer ran out
            raise NoAnswer(f"the store did not acknowledge {local_file.name} within {sum(timeout):.1f} s") from error
        raise
    augmented_raise_for_status(answer)


def delete(repo: Any, artifact_path: str, end: float) -> None:
    """Remove ``artifact_path`` (a file, or a folder with all it holds) from ``repo``; over HTTP by ``end`` (or
    within :data:`MIN_DELETE_S`). MLflow 2's server removes folders only (a file: 500, its ``rmtree`` fails)."""
    timeout = max(MIN_DELETE_S, end - time.monotonic())
    http = _http(repo)
    if http is None:
        repo.delete_artifacts(artifact_path)  # raises where the store cannot delete (AzureML's artifact service)
        return
    from mlflow.utils.rest_utils import augmented_raise_for_status, http_request

    answer = http_request(http, posixpath.join("/", artifact_path), "DELETE", max_retries=0, timeout=timeout)
    augmented_raise_for_status(answer)


def _timeout(end: float) -> tuple[float, float]:
    """The (connect, read) timeouts of one request that must end by ``end``: together they end by then."""
    left = end - time.monotonic()
    if left < MIN_REQUEST_S:
        raise DeadlinePassed(f"{max(0.0, left):.1f} s left")
    connect = min(CONNECT_S, left / 4)
    return connect, left - connect


def _http(repo: Any) -> Any:
    """The credentials of ``repo``'s server when it is the server's artifact proxy, else None."""
    from mlflow.store.artifact.http_artifact_repo import HttpArtifactRepository

    return repo._host_creds if isinstance(repo, HttpArtifactRepository) else None
