from __future__ import annotations

from hvd_mlflow.common.redact import mask_uri, redact


def test_credentials_are_masked():
    assert mask_uri("https://alice:hunter22@host/x?token=abc&a=1") == "https://***@host/x?token=***&a=1"
    assert mask_uri("sqlite:////work/mlflow.db") == "sqlite:////work/mlflow.db"
    text = "POST https://u:p4ssw0rd@h/x failed; token eyJhbGciOi.secret"
    out = redact(text, {"MLFLOW_TRACKING_TOKEN": "eyJhbGciOi.secret", "HOME": "/root"})
    assert "p4ssw0rd" not in out and "eyJhbGciOi.secret" not in out and "/x failed" in out
