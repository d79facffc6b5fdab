"""Keep credentials out of everything hvd-mlflow writes or says.

A tracking URI may carry ``user:password@`` or a ``token=`` query; environment variables whose names say
KEY, SECRET, TOKEN or PASSWORD hold secrets. :func:`redact` removes all of them from a piece of text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|SAS", re.IGNORECASE)
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<userinfo>[^/@\s]+)@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:[^=&\s]*(?:key|secret|token|password|sig|sas)[^=&\s]*)=)[^&\s]+")


def mask_uri(uri: str) -> str:
    """``uri`` without the credentials it may carry (user info, secret-looking query values)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return redact(uri)
    if "@" in parts.netloc:
        uri = urlunsplit(parts._replace(netloc=MASK + "@" + parts.netloc.rsplit("@", 1)[1]))
    return _SECRET_QUERY.sub(r"\1" + MASK, uri)


def redact(text: str, environ: Mapping[str, str] = os.environ) -> str:
    """``text`` with credentials in URIs and the values of secret environment variables masked."""
    text = _USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text)
    text = _SECRET_QUERY.sub(r"\1" + MASK, text)
    secrets = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= 6}  # long enough to matter
    for value in sorted(secrets, key=len, reverse=True):  # the longest first: one may contain another
        text = text.replace(value, MASK)
    return text
