"""What a tracking server's answer means to the uploader: the HTTP status behind an error, whether the server will
give it again, which refusals are about the request itself rather than its content, and a 409 taken as "already
there".

Used on rank 0's sender thread and by the command line (``hvd-mlflow sync``), never on the training thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

NOT_ABOUT_CONTENT = (401, 403, 404)  # refusals of the request itself (auth, run), never split by key
# refusals of the credentials (401) or of the run (404): no entry is to blame, none is marked rejected; they stay
# pending (the sender backs off; sync fails saying why, for a sync with the right credentials or server)
NOT_ABOUT_ENTRIES = (401, 404)


def http_status(error: BaseException) -> int | None:
    """The HTTP status behind ``error``: MLflow's exceptions, or the Azure SDK's (AzureML artifacts)."""
    from mlflow.exceptions import MlflowException

    if isinstance(error, MlflowException):
        return error.get_http_status_code()
    status = getattr(error, "status_code", None) or getattr(getattr(error, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def is_permanent(error: BaseException) -> bool:
    """Whether the server will give the same answer again (a 4xx other than 408 and 429)."""
    status = http_status(error)
    return status is not None and 400 <= status < 500 and status not in (408, 429)


def applied_once(upload: Callable[[], Any]) -> None:
    """``upload()``; a 409 (AzureML: the artifact exists, from an earlier try whose answer was lost) is success."""
    try:
        upload()
    except Exception as error:
        if http_status(error) != 409:
            raise
